"""Short terminal views of long results (issue 31): the audit, the plan, the pipeline summary.

Pure functions: a result's dict form (what the journal, `--json` and the report hold) in, Rich
markup lines out. Failures come first and are never cut; everything else is one line each,
shortened to the terminal's width by the caller (`print_lines`), with the full text one flag away
(`--verbose`, `--all`, `--json`, the report).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.markup import escape

from ..outcome import AuditDetails

NOT_LOADED = "not-loaded"


@dataclass(frozen=True)
class Line:
    markup: str
    wrap: bool = False  # a failure's text: folded over several lines, never cut


def print_lines(lines: Iterable[Line], console: Any) -> None:
    """On a terminal each line fits its width (failures fold); in a pipe or a log every line is
    whole, one line each (grep finds it)."""
    for line in lines:
        if not console.is_terminal:
            console.print(line.markup, soft_wrap=True)
        elif line.wrap:
            console.print(line.markup, overflow="fold")
        else:
            console.print(line.markup, no_wrap=True, overflow="ellipsis", crop=True)


# ---- the audit -------------------------------------------------------------------------------

def audit_lines(details: AuditDetails | dict[str, Any]) -> list[Line]:
    """One audit (AuditResult.as_dict()): a header, the failing checks in full, one line of the
    others, then per target one line of counts and one short line per object that is not
    plainly covered: failing ones first (red), then PTX-JIT, then not loaded, each with a short
    reason key."""
    audit = details if isinstance(details, AuditDetails) else AuditDetails.from_json(details)
    status = (audit.status or "?").upper()
    style = "bold red" if status == "FAIL" else "green"
    objects = len(audit.coverage)
    header = (f"audit [bold]{escape(audit.cell or '?')}[/]: [{style}]{status}[/]"
              f"  ({escape(_short_image(audit.image or ''))}"
              + (f", {objects} GPU objects" if objects else "")
              + (f", {audit.duration_s:.0f} s" if audit.duration_s else "") + ")")
    lines = [Line(header)]
    by_status = {s: [c for c in audit.checks if c.status == s] for s in ("fail", "pass", "skip")}
    lines += [Line(f"  [bold red]FAIL[/] {escape(c.name)}: {escape(c.detail)}", wrap=True)
              for c in by_status["fail"]]
    if by_status["pass"]:
        lines.append(Line(f"  [green]pass[/]: {escape(' '.join(c.name for c in by_status['pass']))}"))
    lines += [Line(f"  [yellow]skip[/] {escape(c.name)}: {escape(_first_clause(c.detail))}")
              for c in by_status["skip"]]
    for target, group in audit.groups.items():
        lines += _target_lines(target, group)
    lines.append(Line("  [dim]full reasons and sources: --verbose, --json, or the report[/]"))
    return lines


def _target_lines(target: str, group: dict[str, Any]) -> list[Line]:
    counts = group.get("counts") or {}
    failing = counts.get("uncovered", 0)
    lines = [Line(f"  [bold]{escape(target)}[/]: {counts.get('covered', 0)} covered · "
                  f"{counts.get('ptx-jit', 0)} PTX-JIT · {counts.get(NOT_LOADED, 0)} not loaded"
                  f" · " + (f"[bold red]{failing} failing[/]" if failing else "0 failing"))]
    rows: list[tuple[str, str, str]] = []  # (label, key, path)
    for item in group.get("uncovered") or []:
        path, key = (item["object"], item.get("key", "uncovered")) if isinstance(item, dict) \
            else (item, "uncovered")
        rows.append(("[bold red]FAIL[/]      ", key, path))
    for item in group.get("ptx-jit") or []:
        rows.append(("[yellow]PTX-JIT[/]   ", f"{item.get('ptx') or 'PTX'} JIT", item["object"]))
    for item in group.get(NOT_LOADED) or []:
        entry = f" ({item['entry']})" if item.get("entry") else ""
        rows.append(("[dim]not loaded[/]", f"{item.get('key') or 'waived'}{entry}",
                     item["object"]))
    # the key before the path: keys are short, a path too long for the screen loses its end
    width = max((len(key) for _, key, _ in rows), default=0)
    lines += [Line(f"    {label} {escape(key.ljust(width))}  {escape(path)}")
              for label, key, path in rows]
    if group.get("ptx-jit"):
        lines.append(Line("    [dim]PTX JIT: the driver compiles the PTX at first load "
                          "(a slower first start)[/]"))
    return lines


def _short_image(image: str) -> str:
    return image[:19] if image.startswith("sha256:") else image


def _first_clause(text: str, limit: int = 90) -> str:
    """The start of a long detail, up to its first `;` (the rest is in --verbose)."""
    head = text.split("; ")[0]
    return head if len(head) <= limit else head[:limit - 1] + "…"


# ---- the plan --------------------------------------------------------------------------------

STATUS_STYLE = {"planned": "green", "pruned": "yellow", "unresolved": "magenta",
                "unverified": "cyan"}


@dataclass(frozen=True)
class PlanRow:
    cell: str
    status: str
    text: str  # settings, or the reasons' subjects with their footnote numbers
    profiles: str = ""  # the serve profiles judged on the cell (`fp8?` unverified, `fp8-` pruned)
    capacity: str = ""  # the capacity model's tok/s per GPU of each planned profile, in order


def profile_columns(profiles: list[dict[str, Any]] | None, note: Any) -> tuple[str, str]:
    """(profiles, capacity) of a cell's settings.profiles: planned ones by name, an unverified
    one with `?` and a pruned one with `-`, each with its first reason as a footnote; the
    capacity column is the predicted output tok/s per GPU of the planned ones (model/capacity.py
    at the plan's context), `/`-separated in the same order."""
    names, rates = [], []
    for profile in profiles or []:
        mark = {"planned": "", "unverified": "?", "pruned": "-"}.get(str(profile.get("status")), "?")
        reasons = profile.get("reasons") or []
        footnote = f"[{note(reasons[0]['rule'] + ': ' + reasons[0]['reason'])}]" \
            if mark and reasons else ""
        names.append(f"{profile.get('profile')}{mark}{footnote}")
        rate = (profile.get("capacity") or {}).get("tokens_per_s")
        if not mark and rate is not None:
            rates.append(f"{rate:,.0f}")
    return " ".join(names), "/".join(rates)


def split_reason(rule: str, reason: str) -> tuple[str, str]:
    """(subject, explanation) of a verdict: `torch 2.10.0+cu130: download.pytorch.org cannot
    be reached ...` splits at its first `: ` when what precedes it is short; else no subject."""
    head, sep, rest = reason.partition(": ")
    if sep and len(head) <= 60 and rest:
        return head, f"{rule}: {rest}"
    return "", f"{rule}: {reason}"


def plan_rows(plans: list[Any], settings_text: Any) -> tuple[list[PlanRow], list[str]]:
    """One row per cell that is not pruned, one per pruning rule (its cells counted), and the
    distinct reasons once each as footnotes [n]. `settings_text(plan)`: a planned cell's text."""
    notes: dict[str, int] = {}

    def note(text: str) -> int:
        return notes.setdefault(text, len(notes) + 1)

    rows: list[PlanRow] = []
    pruned: dict[str, list[Any]] = {}
    for plan in plans:
        if plan.status == "pruned":
            pruned.setdefault(plan.verdicts[0].rule if plan.verdicts else "?", []).append(plan)
            continue
        columns = profile_columns(getattr(plan.settings, "profiles", None), note)
        if not plan.verdicts:
            rows.append(PlanRow(plan.id, plan.status, settings_text(plan), *columns))
            continue
        parts = []
        for verdict in plan.verdicts:
            subject, explanation = split_reason(verdict.rule, verdict.reason)
            parts.append(f"[{note(explanation)}] {subject or verdict.rule}")
        rows.append(PlanRow(plan.id, plan.status, "; ".join(parts), *columns))
    for rule, members in sorted(pruned.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        first = members[0].verdicts[0] if members[0].verdicts else None
        number = note(f"{rule}: {first.reason}") if first else 0
        rows.append(PlanRow(f"{len(members)} × {rule}", "pruned",
                            f"[{number}] e.g. {members[0].id}" if number else ""))
    return rows, [f"[{n}] {text}" for text, n in notes.items()]


def plan_view(plans: list[Any], settings_text: Any) -> list[Line]:
    """The default `plan` view: one line per row (the cell and status never cut, the rest
    shortened to the width), then the footnotes, one line each (the whole text and sources:
    `plan --all` or `--json`)."""
    rows, footnotes = plan_rows(plans, settings_text)
    cell_w = max((len(r.cell) for r in rows), default=4)
    status_w = max((len(r.status) for r in rows), default=6)
    shown = any(r.profiles for r in rows)
    prof_w = max([len(r.profiles) for r in rows] + [len("profiles")]) if shown else 0
    cap_w = max([len(r.capacity) for r in rows] + [len("tok/s/GPU")]) if shown else 0
    head = f"{'profiles'.ljust(prof_w)}  {'tok/s/GPU'.ljust(cap_w)}  " if shown else ""
    lines = [Line(f"[bold]{'cell'.ljust(cell_w)}  {'status'.ljust(status_w)}  {escape(head)}"
                  "settings / reasons[/]")]
    for row in rows:
        style = STATUS_STYLE.get(row.status, "white")
        middle = f"{row.profiles.ljust(prof_w)}  {row.capacity.ljust(cap_w)}  " if shown else ""
        lines.append(Line(f"{escape(row.cell.ljust(cell_w))}  "
                          f"[{style}]{row.status.ljust(status_w)}[/]  {escape(middle)}"
                          f"{escape(row.text)}"))
    lines += [Line(escape(text)) for text in footnotes]
    if footnotes:
        lines.append(Line("[dim]every pruned cell, each reason in full with its source: "
                          "plan --all, or plan --json[/]"))
    return lines


# ---- the pipeline's closing summary ----------------------------------------------------------

SUMMARY_STEPS = ("lock", "render", "build", "audit", "smoke", "tag", "publish", "train")


def _clock_of(stage: Any) -> str:
    """HH:MM:SS (UTC) of a stage's end, from its journal time ("2026-12-06T06:01:02Z")."""
    finished = getattr(stage, "finished", None) or ""
    return finished[11:19] if len(finished) >= 19 else "?"


def usable_times(cell: Any) -> tuple[str, str]:
    """(when the cell's serving image was built, when its training image was): each the
    time its step ended, "failed", or "-" when there is none (issue 47: serving first)."""
    stages = {s.name: s for s in cell.stages}

    def at(name: str) -> str:
        stage = stages.get(name)
        if stage is None or stage.status in ("skip", "running"):
            return "-"
        return _clock_of(stage) if stage.status == "pass" else "failed"
    return at("build"), at("train")


def next_step(cell: Any, registry_set: bool = True) -> tuple[str, str] | None:
    """(why the cell is not tagged and published, the command that moves it on, runnable as
    printed), or None for a cell that is done. `cell`: a report.CellReport; `registry_set`:
    publish.registry (or --registry) names a registry, else publish is shown with the
    --registry it needs."""
    stages = {s.name: s for s in cell.stages}

    def reason_of(*names: str, default: str = "") -> str:
        for name in names:
            stage = stages.get(name)
            if stage is not None and stage.reason:
                return stage.reason.strip().splitlines()[0]
        return default

    cid, arch = cell.id, cell.axes.get("arch", "")
    if cell.outcome == "pruned":
        return None
    if cell.outcome == "failed":
        step = cell.failed_stage or "?"
        log = stages[step].log if step in stages and stages[step].log else None
        why = reason_of(step, default=f"failed at {step}")
        command = {"audit": f"infermatrix audit {cid} --verbose  (every reason and source)",
                   "smoke": f"infermatrix smoke {cid}" + (f"  (log: {log})" if log else ""),
                   "tag": f"infermatrix tag {cid}  (after resolving the tag's owner)",
                   }.get(step, f"fix, then infermatrix pipeline --select {cid}"
                         + (f"  (log: {log})" if log else ""))
        return why, command
    if cell.outcome == "built":
        why = reason_of("tag", "smoke", default="the required smoke levels have not passed")
        if arch in ("", "cpu"):
            return why, f"infermatrix smoke {cid} && infermatrix tag {cid}"
        return why, (f"on a host with an {arch} GPU: infermatrix smoke {cid} "
                     f"--model-path WEIGHTS_DIR && infermatrix tag {cid}; or from here, on "
                     f"that host's engine: infermatrix smoke {cid} --on ssh://USER@GPU-HOST "
                     f"--model-path WEIGHTS_DIR_ON_THAT_HOST && infermatrix tag {cid}")
    if cell.outcome == "verified":
        return reason_of("tag", default="not tagged yet"), f"infermatrix tag {cid}"
    if cell.outcome == "not-built":
        return (reason_of("build", "render", "lock", default="not reached"),
                f"infermatrix pipeline --select {cid}")
    publish = stages.get("publish")
    if publish is None or publish.status != "pass":
        return ("tagged, not published" + (f": {publish.reason.splitlines()[0]}"
                                           if publish is not None and publish.reason else ""),
                f"infermatrix publish --select {cid}"
                + ("" if registry_set else " --registry REGISTRY_HOST/PATH  (publish.registry "
                   "is not set in matrix.yaml)"))
    return None


def train_step(cell: Any) -> tuple[str, str] | None:
    """(why the cell's training image failed, the command that makes it again), or None."""
    stage = next((s for s in cell.stages if s.name == "train"), None)
    if stage is None or stage.status != "fail":
        return None
    why = (stage.reason or "failed").strip().splitlines()[0]
    return (f"training image: {why}", f"fix, then infermatrix pipeline --select {cell.id}"
            + (f"  (log: {stage.log})" if stage.log else ""))


def pipeline_summary(cells: list[Any], registry_set: bool = True) -> list[Line]:
    """One line per cell that is not pruned (report.CellReport): outcome, each step's time, the
    image size; then for each cell not done, its reason and the command that moves it on."""
    from ..stages.report import RICH_STYLES, human_duration, human_size

    shown = [c for c in cells if c.outcome != "pruned"]
    steps = [s for s in SUMMARY_STEPS if any(st.name == s for c in shown for st in c.stages)]
    cell_w = max((len(c.id) for c in shown), default=4)
    outcome_w = max((len(c.label) for c in shown), default=7)
    trains = any(st.name == "train" for c in shown for st in c.stages)
    head = (f"[bold]{'cell'.ljust(cell_w)}  {'outcome'.ljust(outcome_w)}  "
            + "".join(f"{s:>8}" for s in steps) + f"{'size':>9}{'serving':>10}"
            + (f"{'train':>10}" if trains else "") + "[/]")
    lines = [Line(head)]
    for cell in shown:
        times = {s.name: s.duration_s for s in cell.stages}
        style = RICH_STYLES.get(cell.outcome, "white")
        serving, train = usable_times(cell)
        lines.append(Line(f"{escape(cell.id.ljust(cell_w))}  [{style}]"
                          f"{escape(cell.label.ljust(outcome_w))}[/]  "
                          + "".join(f"{human_duration(times.get(s)) or '-':>8}" for s in steps)
                          + f"{human_size(cell.image_size) or '-':>9}{serving:>10}"
                          + (f"{train:>10}" if trains else "")))
    lines.append(Line("serving: when the serving image was built (UTC; usable for serving "
                      "from then, tagged once verified); train: when its training image "
                      "(profile: train kernels) was, after every serving image"))
    todo = [(cell, step) for cell in shown
            if (step := next_step(cell, registry_set)) is not None]
    todo += [(cell, step) for cell in shown if (step := train_step(cell)) is not None]
    if todo:
        lines.append(Line("[bold]what now:[/]"))
    for cell, (why, command) in todo:
        lines.append(Line(f"  {escape(cell.id)}: {escape(why)}", wrap=cell.outcome == "failed"))
        lines.append(Line(f"    → {escape(command)}", wrap=True))
    return lines
