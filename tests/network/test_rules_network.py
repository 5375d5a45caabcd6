"""rules.yaml checked against its sources where CI reaches them (PyPI; the CUDA compiler that
.ci/provision installs). The other tables (drivers.yaml's minimum drivers, the attention
backends' arches, the torch-index variants besides PyPI's) come from pages CI cannot reach:
their tests (test_publish.py, test_plan.py) are data checks of the tables, said so there."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from packaging.version import Version

from infermatrix.model import rules
from infermatrix.model.index import SIMPLE_JSON, MetadataCache, _http_get, index_url
from tests.support.cuda_tools import NO_NVCC, NVCC

pytestmark = pytest.mark.network

VARIANTS = rules.load_rules()["torch-cuda-variant"]["variants"]


@pytest.fixture(scope="module")
def torch_versions() -> set[str]:
    listing = json.loads(_http_get(index_url().rstrip("/") + "/torch/", {"Accept": SIMPLE_JSON}))
    return set(listing["versions"])


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> MetadataCache:
    return MetadataCache(tmp_path_factory.mktemp("index"))


@pytest.mark.parametrize("minor", sorted(VARIANTS, key=Version))
def test_pypi_torch_wheel_is_one_of_the_variants_the_table_lists(minor, torch_versions, live):
    """The planner reads PyPI torch's CUDA build from METADATA (Requires-Dist
    nvidia-cuda-runtime-cuXX / cuda-toolkit[cudart]); the table's variant list for that minor must
    contain it, or the table is stale."""
    version = f"{minor}.0"
    assert version in torch_versions, f"torch {version} is not on PyPI: the table names it"
    cuda = rules.cuda_of_requirements(live.release("torch", version).requires_dist)
    assert "cu" + cuda.replace(".", "") in VARIANTS[minor]["all"], (version, cuda)


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_arch_minimum_cuda_against_the_cuda_13_compiler():
    """Every arch whose minimum CUDA is <= the provisioned nvcc's version is one it compiles."""
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True,
                             check=True).stdout
    nvcc_cuda = Version(re.search(r"release (\d+\.\d+)", version).group(1))
    listed = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True,
                            check=True).stdout.split()
    minimum = rules.load_rules()["arch-min-cuda"]["minimum"]
    known = [arch for arch, cuda in minimum.items() if Version(cuda) <= nvcc_cuda]
    assert {"sm_90", "sm_120", "sm_121"} <= set(known)
    missing = [a for a in known if f"compute_{a.removeprefix('sm_')}" not in listed]
    assert not missing, f"nvcc {nvcc_cuda} does not compile {missing}"
