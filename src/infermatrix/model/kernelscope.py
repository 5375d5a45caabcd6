"""What a cell's compiled kernels cover and who loads them (pure functions, no I/O).

- The FlashInfer ahead-of-time scope comes from the model's attention shape (matrix.yaml
  `model.attention`, from the model's config.json): only the modules those shapes need are
  compiled, so the build takes minutes; other shapes JIT-compile at serve time.
- Each kernel names its consumer in the image (matrix.yaml `build.kernels.<name>.consumer`): the
  engine, or a profile such as training with transformers for flash-attn.
- Each kernel names the image profile that loads it (`build.kernels.<name>.profile`): `serve`
  (the default) goes into the serving image, `train` only into the `train` target built on top
  of it after the run's serving images (issue 47: vLLM serves without flash-attn).
- The FlashInfer sdist is checked against the hashes the cell's lock pins for flashinfer-python.
"""

from __future__ import annotations

import re
from typing import Any

from .spec import SERVE, TRAIN, kernel_profile as profile, lock_packages  # noqa: F401

# The attention modules the FlashInfer AOT build covers per head dim (templates/files/
# flashinfer-aot.py.j2): FA2 batch prefill (paged and ragged KV) and batch decode.
FLASHINFER_ATTENTION = "FA2 batch prefill + decode"
DEFAULT_FLASHINFER_FAMILIES = ("attention", "sampling")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_hashes(lock_text: str | None, package: str) -> list[str]:
    """The sha256 hashes the lock pins for `package` (its wheels and its sdist)."""
    return [digest for locked in lock_packages(lock_text)
            if normalize(locked.name) == normalize(package) for digest in locked.hashes]


def flashinfer_scope(model: dict[str, Any], version: str | None, platform: str) -> dict[str, Any]:
    """The FlashInfer AOT scope of a cell, from matrix.yaml `model.attention`.

    Without `model.attention` every family is left to JIT: the scope is empty."""
    attention = model.get("attention") or {}
    head_dims = sorted({int(h) for h in attention.get("head_dims", [])})
    dtype = str(attention.get("dtype", "bfloat16"))
    families = list(attention.get("flashinfer_families", DEFAULT_FLASHINFER_FAMILIES))
    heads = (f"{attention['num_attention_heads']} q / {attention['num_key_value_heads']} kv heads"
             if "num_attention_heads" in attention and "num_key_value_heads" in attention
             else "heads not stated")
    parts = [f"{FLASHINFER_ATTENTION} {dtype} head_dim {','.join(map(str, head_dims))} ({heads})"]
    parts += [family for family in ("sampling", "cascade") if family in families]
    return {
        "model": str(model.get("name", "")),
        "head_dims": head_dims,
        "dtype": dtype,
        "families": families,
        "heads": heads,
        "summary": "; ".join(parts) if head_dims else "none (JIT at serve time)",
        "flashinfer_version": version or "0",
        "wheel_platform": "linux_aarch64" if platform == "linux/arm64" else "linux_x86_64",
    }


def consumer(spec: dict[str, Any], engine: str) -> str:
    """Who loads a compiled kernel in the image (`build.kernels.<name>.consumer`)."""
    return str(spec.get("consumer") or f"engine ({engine})")

