"""When a selector's "latest" passed over a newer release (vLLM 0.34.0 pinned a FlashInfer
release PyPI did not have), `plan`'s summary, the plan step's note and the report say so and
why, not only the last line of `plan` (#45)."""

from __future__ import annotations

from infermatrix.model.cell import Cell, CellPlan
from infermatrix.stages.plan import passed_over_notes
from infermatrix.stages.report import build_report, render_markdown

WHY = ("0.34.0: it pins flashinfer-python==0.7.3, which "
       "https://pypi.org/simple/flashinfer-python/ does not have (yet)")


def planned(cell_id_arch: str, passed_over: list[str]) -> CellPlan:
    cell = Cell("13.0", "2.14.0", "vllm", "0.33.0", cell_id_arch)
    resolution = {"selector": "latest", "version": "0.33.0", "resolved_at": "2026-12-06T00:00Z",
                  "index": "https://pypi.org/simple/vllm/"}
    if passed_over:
        resolution["passed_over"] = passed_over
    return CellPlan(cell, "planned", [], None, "axes", resolution)


def test_one_note_per_selector_naming_the_pick_the_newer_release_and_why():
    notes = passed_over_notes([planned("sm_120", [WHY]), planned("sm_121", [WHY]),
                               planned("sm_120", [])])
    assert notes == ["vllm latest = 0.33.0, not the newest release 0.34.0: it pins "
                     "flashinfer-python==0.7.3, which https://pypi.org/simple/flashinfer-python/ "
                     "does not have (yet); an install from another index (the engine's own "
                     "wheel index) may already run 0.34.0"]
    assert passed_over_notes([planned("sm_120", [])]) == []


def test_the_report_says_it_in_the_cell_and_at_the_top_of_the_markdown():
    plans = [planned("sm_120", [WHY]), planned("sm_121", [WHY])]
    report = build_report({}, plans)
    cell = next(c for c in report.cells if c.id == plans[0].id)
    note = next(r for r in cell.reasons if r["rule"] == "latest-passed-over")
    assert "not the newest release 0.34.0" in note["reason"]
    assert note["source"] == "https://pypi.org/simple/vllm/"
    markdown = render_markdown(report)
    top = markdown.split("| cell |")[0]
    assert top.count("**Not the newest:**") == 1 and "0.34.0" in top


def test_plan_cli_says_it_in_the_summary_line(tmp_path, monkeypatch, capsys):
    from infermatrix.cli import plan as cli_plan
    from infermatrix.stages.plan import Plan

    plans = [planned("sm_120", [WHY])]
    monkeypatch.setattr(cli_plan, "load_context", lambda args, log=True: _Ctx(tmp_path))
    monkeypatch.setattr(cli_plan, "load_full_plan", lambda args: (_Ctx(tmp_path), Plan(plans)))
    monkeypatch.setattr(cli_plan, "prune_unsatisfiable", lambda ctx, plans: None)
    args = type("A", (), {"wait": False, "diff": False, "planned": False, "json": False,
                          "all": False, "select": [], "skip": [], "forecast": False})()
    assert cli_plan.run(args) == 0
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if line.startswith("1 planned"))
    assert '1 "latest" passed over a newer release' in summary
    assert "NOT THE NEWEST: vllm latest = 0.33.0" in out.replace("\n", " ")


class _Ctx:
    offline = False

    def __init__(self, root):
        from infermatrix.state import StatePaths
        self.state = StatePaths(root / ".state")
