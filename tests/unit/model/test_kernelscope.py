"""Pure logic of kernel scope, consumers and lock subsets (no Docker)."""

from __future__ import annotations

from infermatrix.model import kernelscope

LOCK = """# header
--index-url https://pypi.org/simple

apache-tvm-ffi==0.1.12 \\
    --hash=sha256:""" + "a" * 64 + """
    # via flashinfer-python
flashinfer-python==0.7.2 \\
    --hash=sha256:""" + "b" * 64 + """ \\
    --hash=sha256:""" + "c" * 64 + """
    # via sglang
numpy==2.3.0 \\
    --hash=sha256:""" + "d" * 64 + """
    # via
    #   apache-tvm-ffi
    #   sglang
sglang==0.5.23 \\
    --hash=sha256:""" + "e" * 64 + """
    # via -r requirements.in
uvicorn==0.40.0 \\
    --hash=sha256:""" + "f" * 64 + """
    # via sglang
"""


def test_locked_hashes_are_every_file_of_the_pin() -> None:
    assert kernelscope.locked_hashes(LOCK, "flashinfer_python") == ["b" * 64, "c" * 64]
    assert kernelscope.locked_hashes(LOCK, "absent") == []
    assert kernelscope.locked_hashes(None, "flashinfer-python") == []


def test_flashinfer_scope_from_the_model_attention() -> None:
    model = {"name": "Qwen/Qwen3.6-27B",
             "attention": {"head_dims": [256], "num_attention_heads": 24,
                           "num_key_value_heads": 4, "dtype": "bfloat16"}}
    scope = kernelscope.flashinfer_scope(model, "0.7.2", "linux/arm64")
    assert scope["head_dims"] == [256] and scope["dtype"] == "bfloat16"
    assert scope["summary"] == ("FA2 batch prefill + decode bfloat16 head_dim 256 "
                                "(24 q / 4 kv heads); sampling")
    assert scope["wheel_platform"] == "linux_aarch64"
    empty = kernelscope.flashinfer_scope({"name": "m"}, None, "linux/amd64")
    assert empty["head_dims"] == [] and empty["summary"].startswith("none")


def test_consumer_defaults_to_the_engine() -> None:
    assert kernelscope.consumer({}, "sglang") == "engine (sglang)"
    assert kernelscope.consumer({"consumer": "profile training"}, "vllm") == "profile training"
