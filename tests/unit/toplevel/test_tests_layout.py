"""The tests' layout (docs/testing.md) holds: a test's folder says what it needs. Checked on
pytest's own collection, so module-level `pytestmark` and per-test marks both count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.paths import REPO


def collected(folder: str, marker: str) -> list[str]:
    """Test ids under `folder` that the marker expression selects. Collected without CI=true:
    under it an empty collection is a failure (tests/conftest.py), and empty is the answer
    wanted here."""
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    found = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                            "-p", "no:cacheprovider", "-m", marker, folder],
                           capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert found.returncode in (0, 5), found.stdout[-2000:] + found.stderr[-2000:]  # 5: none
    return [line for line in found.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("folder, misplaced", [
    ("tests/unit", "docker or network or realcell"),  # unit: neither Docker nor the index
    ("tests/docker", "not docker"),
    ("tests/network", "docker or realcell"),  # the index, and how its failures are told
])
def test_each_folder_holds_only_the_tests_its_name_says(folder, misplaced):
    assert collected(folder, misplaced) == []
