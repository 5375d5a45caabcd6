"""The run's forecast (issue 47): per cell time, disk, memory; total over the build slots and
the critical path; a long run says how to narrow it. Pure figures in, figures out."""

from __future__ import annotations

from infermatrix.cli import main
from infermatrix.model.forecast import (LONG_RUN_S, CellWork, KernelWork, forecast,
                                        narrowing_lines, schedule)
from tests.paths import TESTS

FA = KernelWork("flash-attn", "flash-attn-2.8.3-x", 3000.0, "model")
FI = KernelWork("flashinfer", "flashinfer-0.7.2-x", 300.0, "history")


def cell(cell_id: str, *kernels: KernelWork, emulation: float = 1.0, reused: bool = False
         ) -> CellWork:
    return CellWork(cell_id, 420.0, "default", kernels, emulation, 40.0, 7.6, reused)


def test_a_cell_is_its_image_plus_the_kernels_it_compiles():
    result = forecast([cell("vllm", FA), cell("sglang", FI)], slots=1)
    assert [c.seconds for c in result.cells] == [3420.0, 720.0]
    assert result.total_s == 4140.0
    assert result.critical_path == ["vllm", "sglang"]
    assert result.disk_gib == 40.0 and result.memory_gib == 7.6


def test_a_key_compiled_by_an_earlier_cell_or_cached_costs_nothing():
    cached = KernelWork("flashinfer", "flashinfer-0.7.2-y", 300.0, "history", cached=True)
    result = forecast([cell("a", FI), cell("b", FI), cell("c", cached)], slots=1)
    assert [c.seconds for c in result.cells] == [720.0, 420.0, 420.0]
    assert "shared" in result.cells[1].kernels and "cached" in result.cells[2].kernels
    assert result.cells[1].memory_gib == 0.0  # nothing compiled: no compile peak


def test_an_emulated_compile_is_multiplied_and_one_over_the_limit_is_not_built():
    short = KernelWork("flashinfer", "fi-arm", 60.0, "model")
    result = forecast([cell("arm", short, emulation=15.0), cell("arm-fa", FA, emulation=15.0)],
                      slots=1, emulation_limit_s=3600.0)
    assert result.cells[0].seconds == 420.0 + 900.0
    assert "emulated x15" in result.cells[0].note
    assert result.cells[1].seconds == 0.0 and result.cells[1].note.startswith("not built")
    assert result.critical_path == ["arm"]


def test_an_unchanged_cell_is_reused_and_takes_nothing():
    result = forecast([cell("done", FA, reused=True)], slots=2)
    assert result.total_s == 0.0 and result.cells[0].note == "unchanged: reused"
    assert result.critical_path == []


def test_slots_share_the_cells_and_the_critical_path_is_the_slot_that_ends_last():
    assert schedule([100.0, 10.0, 10.0, 10.0], 2) == (100.0, [0])
    assert schedule([10.0, 100.0, 10.0], 2) == (100.0, [1])
    assert schedule([5.0, 5.0, 5.0], 1) == (15.0, [0, 1, 2])
    result = forecast([cell("a"), cell("b"), cell("c")], slots=2)
    assert result.total_s == 840.0 and result.critical_path == ["a", "c"]
    assert result.disk_gib == 80.0  # two cells start at once: both need their space


def test_compiles_at_full_width_run_one_after_another_whatever_the_slots():
    result = forecast([cell("a", FA), cell("b", FI), cell("c")], slots=2)
    # slots alone: 3420 s; but each compile takes every CPU: 3000 + 300, plus one image build
    assert result.total_s == 3000.0 + 300.0 + 420.0
    assert result.critical_path == ["a", "b"]
    assert any("one at a time at full width" in note for note in result.notes)


def test_a_kernel_without_a_figure_is_said_not_guessed():
    unknown = KernelWork("mystery", "m", None, "unknown")
    result = forecast([cell("a", unknown)], slots=1)
    assert result.cells[0].seconds == 420.0 and "no figure for mystery" in result.cells[0].note


def test_a_long_run_says_how_to_narrow_it():
    result = forecast([cell("big", FA), cell("small")], slots=1)
    assert result.total_s > LONG_RUN_S and result.long
    lines = narrowing_lines(result, "cu130-*-sm120")
    assert "this run is long" in lines[0]
    text = "\n".join(lines)
    assert "--select 'small'" in text and "--select 'cu130-*-sm120'" in text
    assert "--builder" in text and "build.kernel_cache" in text
    assert narrowing_lines(forecast([cell("small")], slots=1), None) == []


def test_plan_forecast_prints_the_table_without_building(tmp_path, capsys):
    code = main(["plan", "--forecast", "--matrix", str(TESTS / "matrix" / "matrix.yaml"),
                 "--state-dir", str(tmp_path), "--offline"])
    out = capsys.readouterr().out
    assert code == 0
    assert "forecast (this host" in out
    assert "cu130-torch2.13.0-kernel-fixture1.0-sm120" in out.split("forecast (")[1]
    assert "total: about" in out and "critical path:" in out
    assert not (tmp_path / "journal").exists() or not any((tmp_path / "journal").iterdir())


def test_the_pipeline_prints_the_forecast_before_its_first_step(tmp_path, capsys, monkeypatch):
    from infermatrix.cli import pipeline

    seen = []

    def first_step(run):
        seen.append(capsys.readouterr().err)
        return 0, []
    monkeypatch.setattr(pipeline, "run_pipeline", first_step)
    monkeypatch.setattr(pipeline, "closing_lines", lambda run: [])
    monkeypatch.setattr(pipeline, "require_engine", lambda run: None)  # FAKE: no engine here
    code = main(["pipeline", "--matrix", str(TESTS / "matrix" / "matrix.yaml"),
                 "--state-dir", str(tmp_path), "--offline"])
    assert code == 0
    [before] = seen
    assert "forecast (this host" in before and "total: about" in before


def test_a_fresh_forecast_ignores_what_this_state_recorded(tmp_path):
    """bench/forecast_error.py compares what a fresh clone forecasts with what a run took: the
    journal's own time is used only by the ordinary forecast."""
    from infermatrix import journal
    from infermatrix.context import Context
    from infermatrix.stages.forecast import DEFAULT_IMAGE_S, image_seconds

    ctx = Context.load(TESTS / "matrix" / "matrix.yaml", tmp_path / "state")
    cell = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
    journal.record_stage(ctx.state, cell, "build", "pass", duration_s=130.0,
                         details={"kernels": {"k": {"cache": "miss", "duration_s": 30.0}}})
    assert image_seconds(ctx, cell) == (100.0, "journal")
    assert image_seconds(ctx, cell, fresh=True)[0] == DEFAULT_IMAGE_S
