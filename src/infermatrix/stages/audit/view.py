"""Human output of an audit (the terminal's long form)."""

from __future__ import annotations

from typing import Any

from ...model.coverage import Coverage
from .cache import FAIL, PASS, SKIP
from .result import AuditedObject, AuditResult

_STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow", "exact": "green",
          "compatible": "green", "family": "green", "ptx-jit": "yellow", "uncovered": "bold red"}


def render(result: AuditResult, console: Any = None, all_objects: bool = False) -> None:
    """Two rich tables: the checks, then the objects (uncovered and PTX-JIT ones first)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    checks = Table(title=f"audit {result.cell_id} ({result.image}): {result.status.upper()}",
                   show_lines=False)
    for column in ("check", "status", "detail"):
        checks.add_column(column, overflow="fold")
    for check in result.checks:
        checks.add_row(check.name, f"[{_STYLE[check.status]}]{check.status}[/]",
                       escape(check.detail))
    console.print(checks)
    if not result.objects:
        return
    shown = sorted(result.objects, key=lambda o: (o.covered, _best_rank(o), o.path))
    if not all_objects:
        shown = [o for o in shown if not o.covered or _best_rank(o) >= Coverage.PTX_JIT.rank] \
            or shown[:10]
    table = Table(title=f"GPU code: {len(result.objects)} objects"
                  + ("" if all_objects else " (uncovered and PTX-only first; --all lists all)"))
    for column in ("object", "package", "cubins", "ptx", *[str(t) for t in result.targets]):
        table.add_column(column, overflow="fold")
    for obj in shown:
        cells = []
        for decision in obj.decisions:
            style = _STYLE[decision.coverage.value] if obj.fails(decision) or decision.covered \
                else "dim"
            cells.append(f"[{style}]{escape(obj.verdict_text(decision, short=True))}[/]")
        table.add_row(escape(obj.path), escape(obj.package or ""),
                      " ".join(a.sm for a in obj.code.cubins),
                      " ".join(a.compute for a in obj.code.ptx), *cells)
    console.print(table)


def _best_rank(obj: AuditedObject) -> int:
    return max((d.coverage.rank for d in obj.decisions), default=0)
