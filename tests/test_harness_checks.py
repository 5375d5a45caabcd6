"""Harness pieces that run without a GPU or an image: arch matching, import-name discovery."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from infermatrix.harness import gpu_check, static_check


@pytest.mark.parametrize("arch, capability, expected", [
    ("sm_90", (9, 0), True),
    ("sm_120", (12, 0), True),
    ("sm_120", (12, 1), False),   # an exact target names one capability
    ("sm_120a", (12, 1), False),  # sm_120a cubins do not run on GB10
    ("sm_121a", (12, 1), True),
    ("sm_120f", (12, 1), True),   # family: same major, minor >= 0
    ("sm_121f", (12, 0), False),
    ("sm_120", (9, 0), False),
])
def test_arch_matches_capability(arch, capability, expected):
    assert gpu_check.arch_matches(arch, capability) is expected


def test_unknown_kernel_package_fails_the_gpu_level():
    result = gpu_check.check_kernel_package("some-new-kernels")
    assert result["status"] == "fail"
    assert "KERNEL_CHECKS" in result["reason"]


def test_import_names_come_from_distribution_metadata():
    assert "yaml" in static_check.import_names(md.distribution("PyYAML"))
    assert "jsonschema" in static_check.import_names(md.distribution("jsonschema"))


def test_static_check_reports_missing_and_mispinned_distributions():
    assert static_check.check_distribution("no-such-dist-xyz")["status"] == "fail"
    pinned = static_check.check_distribution("PyYAML==0.0.1")
    assert pinned["status"] == "fail" and "pins 0.0.1" in pinned["reason"]
    ok = static_check.check_distribution(f"PyYAML=={md.version('PyYAML')}")
    assert ok["status"] == "pass" and ok["imports"][0]["module"] == "yaml"
