"""scripts/gdn_device_check.py's summary and verdict (the GPU host's GDN run): pure Python.

Its first full run ended in a KeyError ('rel_rms') while printing the summary: a comparison
with non-finite output has no relative errors to show. The printer must show its reason and the
verdict must count it as a failure.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gdn_device_check.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gdn_device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PASS = {"max_abs_error": 0.0006, "ratio": 0.21, "ref_rms": 0.0081, "rel_max": 0.071,
        "rel_rms": 0.0042, "rel_elem": 0.01, "status": "pass", "tol_max": 0.5, "tol_rms": 0.02}
# as compare_relative returns a non-finite result (the 2026-12-06 H100 run's gated_decode.out)
NON_FINITE = {"max_abs_error": float("inf"), "ratio": float("inf"), "ref_rms": 0.0086,
              "reason": "gdn.gated_decode.out: non-finite values in the result",
              "status": "fail", "tol_max": 0.5, "tol_rms": 0.02}
CONTROL = {"margin": 10.0, "worst": "chunk.out", "status": "pass", "what": "x"}


def result(compared, controls=None, status="pass"):
    controls = {c: dict(CONTROL) for c in ("output_x0.8", "no_decay", "no_initial_state",
                                           "heads_permuted")} if controls is None else controls
    return {"status": status, "compared": compared, "negative_controls": controls}


def test_a_non_finite_comparison_is_printed_with_its_reason(script):
    lines = script.summary("vllm seed 2", result({"chunk.out": PASS,
                                                  "gated_decode.out": NON_FINITE},
                                                 status="fail"))
    assert lines[0] == "vllm seed 2: status fail"
    assert "margin 4.8x" in lines[1] and "rel_elem 1.000e-02" in lines[1]
    assert "gated_decode.out" in lines[2] and "non-finite values in the result" in lines[2]
    assert "fail" in lines[2]
    assert any("control no_decay" in line and "fails by 10.0x" in line for line in lines)


def test_a_shape_failure_without_ref_rms_is_printed_too(script):
    line = script.part_line("chunk.out", {"status": "fail", "ratio": float("inf"),
                                          "reason": "gdn.chunk.out: shape (1,)"})
    assert "shape (1,)" in line


def test_the_run_is_as_expected_only_with_every_margin(script):
    assert script.as_expected(result({"chunk.out": PASS}))
    assert not script.as_expected(result({"chunk.out": PASS, "x.out": NON_FINITE},
                                         status="fail"))
    assert not script.as_expected(result({"chunk.out": {**PASS, "ratio": 0.5}}))   # 2x only
    weak = result({"chunk.out": PASS})
    weak["negative_controls"]["no_decay"]["margin"] = 2.9
    assert not script.as_expected(weak)
    three = result({"chunk.out": PASS})
    del three["negative_controls"]["heads_permuted"]
    assert not script.as_expected(three)
    assert not script.as_expected(result({}))
    assert not script.as_expected(result({"chunk.out": {"status": "pass"}}))  # no ratio
