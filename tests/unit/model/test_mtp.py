"""MTP speculative decoding only when the weights are there (model/mtp.py, issue 30): no Docker.

The weights are detected from real safetensors files written here (the `safetensors` format:
8-byte header length, JSON header, data) and from an index like the model's own.
"""

from __future__ import annotations

from tests.paths import TESTS

import json
import struct
from pathlib import Path

from infermatrix.config import load_matrix
from infermatrix.model.mtp import find_weights, launch_args
from infermatrix.consumer.deploy import Request, service
from infermatrix.consumer.pull import serve_command

ROOT = TESTS.parent


def write_safetensors(path: Path, names: list[str]) -> None:
    """A valid safetensors file with one 2-byte bf16 tensor per name."""
    header, offset = {}, 0
    for name in names:
        header[name] = {"dtype": "BF16", "shape": [1], "data_offsets": [offset, offset + 2]}
        offset += 2
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_a_download_without_the_head_gets_no_flags(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", ["model.embed_tokens.weight"])
    weights = find_weights(tmp_path)
    assert not weights.present and "model.safetensors" in weights.evidence
    matrix = load_matrix(ROOT / "matrix.yaml")
    assert launch_args(matrix.model, "vllm", weights) == []


def test_mtp_tensors_in_the_index_or_a_shard_or_their_own_file_are_found(tmp_path):
    index = tmp_path / "indexed"
    index.mkdir()
    (index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
        "mtp.fc.weight": "model-00002-of-00002.safetensors",
        "mtp.layers.0.mlp.down_proj.weight": "model-00002-of-00002.safetensors"}}))
    found = find_weights(index)
    assert found.present and "2 mtp.* tensors" in found.evidence
    shard = tmp_path / "shard"
    shard.mkdir()
    write_safetensors(shard / "model.safetensors", ["lm_head.weight", "mtp.norm.weight"])
    assert find_weights(shard).present
    own = tmp_path / "own"
    own.mkdir()
    write_safetensors(own / "mtp.safetensors", ["mtp.fc.weight"])
    assert find_weights(own).evidence == "mtp.safetensors"


def test_the_shipped_flags_per_engine(tmp_path):
    write_safetensors(tmp_path / "mtp.safetensors", ["mtp.fc.weight"])
    matrix = load_matrix(ROOT / "matrix.yaml")
    weights = find_weights(tmp_path)
    vllm = launch_args(matrix.model, "vllm", weights)
    assert vllm[0] == "--speculative-config" and json.loads(vllm[1])["method"] == "mtp"
    assert launch_args(matrix.model, "sglang", weights)[:2] == ["--speculative-algorithm",
                                                                 "NEXTN"]
    assert launch_args(matrix.model, "vllm-cpu", weights) == []  # none stated for the CPU lane
    assert matrix.model["mtp"]["source"]


def test_deploy_adds_the_locked_flags_only_for_a_model_dir_with_the_head(tmp_path):
    from infermatrix.model.spec import Launch

    entry = {"cell": "c", "reference": "r@sha256:" + "0" * 64, "run": {
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}",
                    "--model", "{model}"],
        "mtp_args": ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
        "env": {}, "gpu": True, "shm_size": "16g", "port": 8000}}
    plain, with_head = tmp_path / "plain", tmp_path / "head"
    for folder in (plain, with_head):
        folder.mkdir()
    write_safetensors(plain / "model.safetensors", ["lm_head.weight"])
    write_safetensors(with_head / "model.safetensors", ["lm_head.weight", "mtp.fc.weight"])
    assert "--speculative-config" not in serve_command(entry, 8000, plain)
    assert serve_command(entry, 8000, with_head)[-2] == "--speculative-config"
    launch = Launch(serve=(), args=(), env={}, shm_size="16g", port=8000, health="/health",
                    attention_backend=None, gpu=True)
    body = service(Request(entry, launch, str(with_head)), 8000, 0)
    assert "--speculative-config" in body["command"]
