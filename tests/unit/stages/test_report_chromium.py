"""The HTML report as a person sees it: opened in headless Chromium (Debian's `chromium`).

- the DOM after the page's script ran (`--dump-dom`): the grid has one cell per cell, the detail
  named by `#open=<cell-id>` is open in its panel, and the log tail's `<script>` stayed text;
- screenshots (`--screenshot`): each outcome colour covers as many cell-sized blocks as there
  are cells of that outcome, and the opened panel (red edge, dark log box) is on screen.

Without chromium the tests skip on a developer machine but FAIL under CI=true (.ci/run installs
it, so a missing browser is a broken CI).
"""

from __future__ import annotations

from tests.paths import TESTS

import os
import shutil
import subprocess
from collections import deque
from html.parser import HTMLParser
from pathlib import Path

import pytest

from infermatrix.stages.report import (OUTCOME_COLOURS, build_report, load_plan_file,
                                write_report)
from infermatrix.state import StatePaths

Image = pytest.importorskip("PIL.Image", reason="Pillow (a dev dependency) reads screenshots")

FIXTURE = TESTS / "fixtures" / "journal"
STATE = StatePaths.at(FIXTURE / "state")
FAILED_BUILD = "cu128-torch2.10.0-vllm0.20.1-sm121"
FAILED_AUDIT = "cu130-torch2.11.0-vllm0.20.1-sm121"
EXPECTED_COUNTS = {"tagged": 2, "verified": 1, "built": 1, "failed": 2, "not-built": 3,
                   "pruned": 2}
WINDOW = (1400, 900)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={WINDOW[0]},{WINDOW[1]}"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if _in_ci():
            pytest.fail("CI=true but chromium is not installed (apt-get install chromium)",
                        pytrace=False)
        pytest.skip("chromium is not installed here")
    return path


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    from tests.unit.stages.test_report import journal_with_sizes

    report = build_report(journal_with_sizes(), load_plan_file(FIXTURE / "plan.json"), STATE)
    return write_report(report, out).html


def run_chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    result = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"chromium failed:\n{result.stderr[-3000:]}"
    return result


# -- DOM --------------------------------------------------------------------------------------

class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self._in_title = False
        self.title = ""
        self.log_texts: list[str] = []
        self._in_log = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        self._in_title = tag == "title"
        self._in_log = tag == "pre" and "log" in (attrs.get("class") or "")
        if self._in_log:
            self.log_texts.append("")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_log = False
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._in_log:
            self.log_texts[-1] += data

    def having(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == tag and cls in (a.get("class") or "").split()]


def test_dom_grid_and_opened_detail(chromium, html, tmp_path):
    result = run_chromium(chromium, tmp_path, "--virtual-time-budget=2000", "--dump-dom",
                          f"{html.as_uri()}#open={FAILED_BUILD}")
    dom = _Dom()
    dom.feed(result.stdout)
    cells = dom.having("td", "cell")
    assert len(cells) == sum(EXPECTED_COUNTS.values())
    found = {k: sum(1 for a in cells if a["data-outcome"] == k) for k in EXPECTED_COUNTS}
    assert found == EXPECTED_COUNTS
    opened = [a for a in dom.having("details", "cell-detail") if "open" in a]
    assert [a["id"] for a in opened] == [f"cell-{FAILED_BUILD}"]
    assert "panel" in (opened[0]["class"] or "").split()
    assert [a["data-cell"] for a in dom.having("td", "selected")] == [FAILED_BUILD]
    # The HTML page inside the log tail stayed text: its script did not run or become markup.
    assert dom.title == "infermatrix report"
    assert not [a for _, a in dom.elements if a.get("id") == "pwned"]
    assert sum(1 for t, _ in dom.elements if t == "script") == 1
    assert any("<script>document.title='pwned'" in text for text in dom.log_texts)


# -- pixels -----------------------------------------------------------------------------------

def _rgb(colour: str) -> tuple[int, int, int]:
    colour = colour.lstrip("#")
    return tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4))  # type: ignore[return-value]


def blocks(image, colour: tuple[int, int, int], min_w: int, min_h: int,
           region: tuple[int, int, int, int] | None = None) -> list[tuple[int, int, int, int]]:
    """Bounding boxes of connected areas of `colour` at least min_w x min_h (grid cells, not
    legend swatches or borders)."""
    rgb = image.convert("RGB")
    width, height = rgb.size
    x0, y0, x1, y1 = region or (0, 0, width, height)
    pixels = rgb.load()
    seen: set[tuple[int, int]] = set()
    found = []
    for y in range(y0, y1):
        for x in range(x0, x1):
            if (x, y) in seen or pixels[x, y] != colour:
                continue
            queue, box = deque([(x, y)]), [x, y, x, y]
            seen.add((x, y))
            while queue:
                px, py = queue.popleft()
                box = [min(box[0], px), min(box[1], py), max(box[2], px), max(box[3], py)]
                for nx, ny in ((px + 1, py), (px - 1, py), (px, py + 1), (px, py - 1)):
                    if x0 <= nx < x1 and y0 <= ny < y1 and (nx, ny) not in seen \
                            and pixels[nx, ny] == colour:
                        seen.add((nx, ny))
                        queue.append((nx, ny))
            if box[2] - box[0] + 1 >= min_w and box[3] - box[1] + 1 >= min_h:
                found.append(tuple(box))
    return found


def test_screenshot_grid_colours_match_the_outcomes(chromium, html, tmp_path):
    shot = tmp_path / "grid.png"
    run_chromium(chromium, tmp_path, f"--screenshot={shot}", html.as_uri())
    image = Image.open(shot)
    assert image.size == WINDOW
    for outcome, expected in EXPECTED_COUNTS.items():
        found = blocks(image, _rgb(OUTCOME_COLOURS[outcome]), min_w=60, min_h=25)
        assert len(found) == expected, (outcome, found)


def test_screenshot_shows_the_opened_detail_panel(chromium, html, tmp_path):
    shot = tmp_path / "open.png"
    run_chromium(chromium, tmp_path, "--virtual-time-budget=2000", f"--screenshot={shot}",
                 f"{html.as_uri()}#open={FAILED_BUILD}")
    image = Image.open(shot)
    width, height = image.size
    # The panel's red edge runs the full height of the window, right of the middle.
    edges = blocks(image, _rgb(OUTCOME_COLOURS["failed"]), min_w=4, min_h=height - 2,
                   region=(width // 3, 0, width, height))
    assert len(edges) == 1 and edges[0][2] - edges[0][0] < 12, edges
    panel_left = edges[0][0]
    # The log tail's dark box is inside the panel and large (many lines of text).
    logs = blocks(image, (0x1e, 0x22, 0x28), min_w=300, min_h=150,
                  region=(panel_left, 0, width, height))
    assert logs, "no log box in the opened panel"
    # The grid stays visible on the left, with its colours.
    assert blocks(image, _rgb(OUTCOME_COLOURS["tagged"]), min_w=60, min_h=25,
                  region=(0, 0, panel_left, height))


def test_screenshot_of_failed_audit_highlights_the_uncovered_row(chromium, html, tmp_path):
    shot = tmp_path / "audit.png"
    run_chromium(chromium, tmp_path, "--virtual-time-budget=2000", f"--screenshot={shot}",
                 f"{html.as_uri()}#open={FAILED_AUDIT}")
    image = Image.open(shot)
    width, height = image.size
    pink = blocks(image, (0xff, 0xeb, 0xe9), min_w=40, min_h=10,
                  region=(width // 3, 0, width, height))
    # The alert box and the cells of the uncovered coverage row, all on screen.
    assert len(pink) >= 3, pink
