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


def test_the_chunk_o_import_watch_notes_whether_the_driver_was_active(tmp_path,
                                                                     monkeypatch) -> None:
    """FLA's chunk_o picks its tiles when imported: the harness notes, per chunk_o module,
    whether a compile-only driver was active then (the audit fails the tiles otherwise)."""
    import sys

    from infermatrix.harness import triton_smem

    for package in ("fla_under", "fla_outside"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "chunk_o.py").write_text("BKV_LIST = [32, 64]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(triton_smem, "IMPORTED_UNDER_DRIVER", {})
    triton_smem.watch_chunk_o_imports()
    triton_smem.watch_chunk_o_imports()  # once only
    assert sum(isinstance(f, triton_smem.ChunkOImportWatch) for f in sys.meta_path) == 1
    import fla_outside.chunk_o  # noqa: F401  (no driver open)

    monkeypatch.setattr(triton_smem, "DRIVER_ACTIVE", [1])
    import fla_under.chunk_o  # noqa: F401
    assert triton_smem.IMPORTED_UNDER_DRIVER == {"fla_outside.chunk_o": False,
                                                 "fla_under.chunk_o": True}
    for name in ("fla_under", "fla_under.chunk_o", "fla_outside", "fla_outside.chunk_o"):
        sys.modules.pop(name, None)


class RecordingEngineFake:
    """A recording stand-in for the engine (wiring only; the real census runs in the real lane
    and bench/audit_cold_warm.py): each harness container it is asked for prints `output`."""

    def __init__(self, image_id: str, output: str) -> None:
        self.image_id, self.output, self.containers = image_id, output, 0

    def image_id_of(self, ref: str) -> str:
        return self.image_id

    def run_container(self, spec: object) -> str:
        self.containers += 1
        return f"c{self.containers}"

    def wait_container(self, container: str, timeout: float) -> None:
        return None

    def container_logs(self, container: str) -> str:
        return self.output

    def remove_container(self, container: str) -> None:
        return None


CENSUS = "INFERMATRIX-RESULT " + json.dumps({"status": "pass", "archs": [{
    "arch": "sm_120", "status": "pass", "families": [{"family": "extend", "driven": True,
    "kernels": [{"kernel": "_fwd_kernel", "shared": 73728, "limit": 101376, "num_warps": 8,
                 "num_stages": 1}]}]}]})


def test_a_reaudit_of_the_same_image_reads_its_census_from_the_cache(tmp_path) -> None:
    """Issue 47: the census compiled every autotune config again on each audit (571 s for the
    vLLM sm_120 cell in CI). Kept by image id, harness sources and arguments; judged again."""
    cache = tmp_path / "triton"
    engine = RecordingEngineFake("sha256:aaa", CENSUS)

    def audit_once(image_id: str = "sha256:aaa", model: str = "Qwen/Qwen3.6-27B"):
        engine.image_id = image_id
        return audit.check_triton_smem("img", engine, "sglang", "triton", [Arch(12, 0)], model,
                                       cache=cache)

    first = audit_once()
    assert first.status == PASS and engine.containers == 1 and "cached" not in first.data
    again = audit_once()
    assert engine.containers == 1, "the same image, harness and arguments compiled again"
    assert again.status == PASS and again.data["cached"] and "from the cache" in again.detail
    assert again.data["kernels"] == first.data["kernels"]
    audit_once(image_id="sha256:bbb")  # another image: its own census
    assert engine.containers == 2
    audit_once(model=None)  # other arguments (no model shapes): its own census
    assert engine.containers == 3


def test_a_census_that_never_started_is_not_kept(tmp_path) -> None:
    engine = RecordingEngineFake("sha256:aaa", "Traceback: no module named torch")
    for _ in range(2):
        check = audit.check_triton_smem("img", engine, "sglang", "triton", [Arch(12, 0)],
                                        "Qwen/Qwen3.6-27B", cache=tmp_path / "triton")
        assert check.status == FAIL
    assert engine.containers == 2 and not list((tmp_path / "triton").glob("*"))


def test_the_census_key_follows_image_and_arguments_and_needs_an_image_id() -> None:
    from infermatrix.stages.audit.triton import census_key

    key = census_key("sha256:aaa", ["--engine", "vllm"])
    assert key == census_key("sha256:aaa", ["--engine", "vllm"])
    assert key != census_key("sha256:bbb", ["--engine", "vllm"])
    assert key != census_key("sha256:aaa", ["--engine", "sglang"])
    assert census_key(None, ["--engine", "vllm"]) is None
