"""Speculative decoding with the model's own MTP head, only when its weights are there (issue 30).

Qwen3.6-27B ships a multi-token-prediction head; vLLM and SGLang can use it as a draft
(`model.mtp.launch` in matrix.yaml: the engines' flags, with the source). A download without
those tensors (the seeds' had no `mtp.safetensors`) is the normal case: the flags would make the
engine fail at load, so they are added only when the model directory holds MTP weights:
- a file named `mtp.safetensors`, or
- tensor names starting with `mtp.` in `model.safetensors.index.json`'s weight map, or in
  the header of a single `*.safetensors` file (8-byte length + JSON, read without the data).
Pure apart from reading those small files.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

MTP_PREFIX = "mtp."
MAX_HEADER = 100 * 2**20  # a safetensors header larger than this is not one


@dataclass(frozen=True)
class MtpWeights:
    present: bool
    evidence: str  # where they were found, or what was looked at

    def as_dict(self) -> dict[str, Any]:
        return {"present": self.present, "evidence": self.evidence}


def _header_names(path: Path) -> list[str]:
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            return []
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER:
            return []
        header = json.loads(handle.read(size) or b"{}")
    return [name for name in header if name != "__metadata__"]


def find_weights(model_dir: Path) -> MtpWeights:
    """Whether `model_dir` holds the MTP head's tensors, and where that was seen."""
    if (model_dir / "mtp.safetensors").is_file():
        return MtpWeights(True, "mtp.safetensors")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        names = [n for n in weight_map if n.startswith(MTP_PREFIX)]
        if names:
            return MtpWeights(True, f"{len(names)} mtp.* tensors in {index.name} "
                                    f"({weight_map[names[0]]}, ...)")
        return MtpWeights(False, f"no mtp.* tensor in {index.name}")
    shards = sorted(model_dir.glob("*.safetensors"))
    for shard in shards:
        names = [n for n in _header_names(shard) if n.startswith(MTP_PREFIX)]
        if names:
            return MtpWeights(True, f"{len(names)} mtp.* tensors in {shard.name}")
    looked = ", ".join(s.name for s in shards) or "no *.safetensors"
    return MtpWeights(False, f"no mtp.* tensor ({looked})")


def engine_flags(model: Mapping[str, Any] | None, engine: str) -> list[str]:
    """The engine's MTP flags as matrix.yaml states them (model.mtp.launch), weights or not."""
    return list(((model or {}).get("mtp") or {}).get("launch", {}).get(engine) or [])


def launch_args(model: Mapping[str, Any] | None, engine: str, weights: MtpWeights) -> list[str]:
    """The engine's MTP flags when the weights are there, else none."""
    return engine_flags(model, engine) if weights.present else []
