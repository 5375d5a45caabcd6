"""The host CUDA compiler the tests use: the one .ci/provision installs from NVIDIA's CUDA 13
PyPI wheels (INFERMATRIX_CUDA_TOOLKIT, default /opt/infermatrix-cuda), else an nvcc on PATH (a
developer's machine). CI does not depend on a toolkit the machine happens to ship: the tests
that compile objects pass with /usr/local/cuda* hidden (docs/testing.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TOOLKIT_ENV = "INFERMATRIX_CUDA_TOOLKIT"
DEFAULT_TOOLKIT = Path("/opt/infermatrix-cuda")


def provisioned_home() -> Path:
    """CUDA_HOME of the provisioned wheels: <prefix>/nvidia/cu13 (bin/nvcc, include, lib)."""
    return Path(os.environ.get(TOOLKIT_ENV) or DEFAULT_TOOLKIT) / "nvidia" / "cu13"


def find_nvcc() -> str | None:
    provisioned = provisioned_home() / "bin" / "nvcc"
    if provisioned.is_file() and os.access(provisioned, os.X_OK):
        return str(provisioned)
    return shutil.which("nvcc")


NVCC = find_nvcc()
NO_NVCC = ("nvcc is not installed on this host (.ci/provision installs it into "
           f"{DEFAULT_TOOLKIT}, or set {TOOLKIT_ENV})")
