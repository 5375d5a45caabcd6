"""The Triton shared-memory check: the audit's reading of harness/triton_smem.py's result (the
harness run for real with triton from PyPI: tests/network/test_triton_smem_network.py)."""

from __future__ import annotations

import json

from infermatrix.stages import audit
from infermatrix.stages.audit import FAIL, PASS
from infermatrix.model.coverage import Arch


def test_harness_arguments_come_from_the_limits_and_the_model_data() -> None:
    args = audit.triton_smem_args("sglang", "triton", [Arch(12, 0), Arch(12, 1)],
                                  "Qwen/Qwen3.6-27B")
    assert args[:4] == ["--engine", "sglang", "--backend", "triton"]
    assert "sm_120=101376" in args and "sm_121=101376" in args
    assert args[args.index("--head-dim") + 1] == "256"
    assert args[args.index("--vision-head-dim") + 1] == "72"
    assert audit.triton_smem_args("vllm", None, [Arch(8, 7)], None) is None  # no limit known


def test_judge_reports_bytes_per_kernel() -> None:
    result = {"status": "pass", "archs": [{"arch": "sm_120", "status": "pass", "families": [
        {"family": "extend", "driven": True, "kernels": [
            {"kernel": "_fwd_kernel", "shared": 73728, "limit": 101376, "num_warps": 8,
             "num_stages": 1}]}]}]}
    check = audit.judge_triton(result, "triton")
    assert check.status == PASS and "_fwd_kernel[extend]@sm_120 73728 B" in check.detail
    assert check.data["kernels"][0]["shared"] == 73728
    assert audit.judge_triton(None, "triton", "Traceback").status == FAIL
    json.dumps(check.as_dict())  # journal-ready


def test_a_cpu_only_torch_is_refused_fake_torch_module() -> None:
    from infermatrix.harness import triton_smem

    class FakeVersion:  # the refusal reads torch.version.cuda only
        cuda = None

    import sys
    import types

    fake = types.SimpleNamespace(version=FakeVersion, __version__="2.14.0+cpu")
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake  # type: ignore[assignment]
    try:
        reason = triton_smem.refuse_cpu_torch()
    finally:
        if saved is not None:
            sys.modules["torch"] = saved
        else:
            del sys.modules["torch"]
    assert reason and "CPU-only" in reason and "2.14.0+cpu" in reason
