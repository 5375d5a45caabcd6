"""The compile's progress and ETA from ninja's status lines (model/compileprogress.py), no Docker.

The lines are the shapes the real builds print through BuildKit's plain progress: torch's
cpp_extension (flash-attn: `--dependency-output ... .o.d` first), the cudakern fixture's ninja
(`-c SRC -o OBJ`), a link edge; the clock is given, so the ETA's arithmetic is checked exactly."""

from __future__ import annotations

from tests.paths import TESTS

import pytest

from infermatrix.model import compileprogress as cp
from infermatrix.model.compileplan import load_model as cp_model

FLASH = ("#15 812.4 [3/74] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile "
         "--dependency-output /src/flash-attn/build/temp.linux-x86_64-cpython-311/csrc/flash_attn/"
         "src/flash_bwd_hdim256_bf16_sm80.o.d -I/src/flash-attn/csrc/flash_attn [...] "
         "-gencode arch=compute_120,code=sm_120 --threads 4 -ccbin g++ -std=c++20")
FIXTURE = ("#12 3.10 [2/4] /opt/venv/bin/nvcc -O2 -Xcompiler -fPIC --threads 1 "
           "-gencode arch=compute_120,code=sm_120  -c /src/cudakern/src/scale.cu "
           "-o /src/cudakern/build/cudakern-ninja/scale.o")
FLASHINFER = ("#14 216.8 [13/19]  /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile "
              "-MF /tmp/flashinfer-aot/cached_ops/batch_decode_with_kv_cache_dtype_q_bf16_head_256/"
              "batch_decode_kernel.cuda.o.d -DTORCH_EXTENSION_NAME=x [...] -o x.cuda.o")
LINK = "#12 9.00 [4/4] /opt/venv/bin/nvcc -shared a.o b.o -o /src/x/build/lib/libcudakern.so"


def test_status_lines_name_their_unit() -> None:
    assert cp.parse_status(FLASH) == (3, 74, "src/flash_bwd_hdim256_bf16_sm80")
    assert cp.parse_status(FIXTURE) == (2, 4, "src/scale.cu")
    assert cp.parse_status(LINK) == (4, 4, "lib/libcudakern.so")
    assert cp.parse_status(FLASHINFER) == (
        13, 19, "batch_decode_with_kv_cache_dtype_q_bf16_head_256/batch_decode_kernel.cuda")
    assert cp.parse_status("[1/2] nvcc x.cu") == (1, 2, "x.cu")  # no BuildKit prefix
    assert cp.parse_status("#13 5.759   [1/4] /usr/local/cuda/bin/nvcc -c /src/k/src/reduce.cu "
                           "-o /b/reduce.o") == (1, 4, "src/reduce.cu")  # pip -v's indent
    assert cp.parse_status("#12 3.1 Building wheel for flash_attn: still running...") is None
    assert cp.base_key(cp.unit_key(cp.parse_status(FLASH)[2])) == cp.unit_key(
        "flash_bwd_hdim256_bf16_sm80.cu")  # what the compile model names


def status(n: int, m: int, name: str) -> str:
    return f"#9 1.0 [{n}/{m}] /usr/bin/nvcc -c /src/{name}.cu -o /b/{name}.o"


def test_uniform_weights_extrapolate_the_rate_seen() -> None:
    progress = cp.CompileProgress(started=0.0)
    assert progress.eta_s(10.0) is None  # nothing known yet
    progress.feed(status(1, 4, "a"), 100.0)
    assert progress.eta_s(100.0) == pytest.approx(300.0)
    progress.feed(status(2, 4, "b"), 150.0)
    assert progress.eta_s(150.0) == pytest.approx(150.0)  # 2 files in 150 s, 2 to go
    assert progress.line(150.0) == "2/4 files, 2m30s elapsed, ETA 2m30s (uniform)"


def test_this_hosts_file_times_make_an_uneven_compile_predictable() -> None:
    """Light files first, the heavy one last: the rate of the light ones alone would say 40 s
    left at half-way; the recorded times say 400 s, which is what it takes."""
    record = {"unit_seconds": {"a": 20.0, "b": 20.0, "c": 20.0, "heavy": 400.0}}
    progress = cp.CompileProgress(prior=cp.Prior.from_history(record), started=0.0)
    assert progress.eta_s(0.0) == pytest.approx(460.0)  # before any file: the recorded total
    assert progress.eta_s(4.0) == pytest.approx(460.0)  # the toolchain stages do not count
    assert progress.line(4.0).startswith("the stages before the compile run, 0m04s elapsed")
    progress.feed("#9 0.5 measure: x: start", 5.0)  # the compile's own clock starts here
    for n, name, at in ((1, "a", 25.0), (2, "b", 45.0), (3, "c", 65.0)):
        progress.feed(status(n, 4, name), at)
    assert progress.eta_s(65.0) == pytest.approx(400.0)
    assert progress.unit_seconds == {"src/a": 20.0, "src/b": 20.0, "src/c": 20.0}
    uniform = cp.CompileProgress(started=5.0)
    for n, name, at in ((1, "a", 25.0), (2, "b", 45.0), (3, "c", 65.0)):
        uniform.feed(status(n, 4, name), at)
    assert uniform.eta_s(65.0) == pytest.approx(20.0)


def test_the_model_prior_scales_the_measured_build_to_this_jobs_count() -> None:
    entry = {"wall_s": 714.6, "max_jobs": 16, "tus": 72,
             "heaviest_tus": [{"tu": "flash_bwd_hdim256_bf16_sm80.cu", "s": 162.5}]}
    prior = cp.Prior.from_model(entry, max_jobs=2)
    assert prior.default_weight == pytest.approx(714.6 * 16 / 72)
    assert prior.total_s == pytest.approx(714.6 * 16 / 2)
    assert prior.weights == {"flash_bwd_hdim256_bf16_sm80": 162.5}


def test_a_second_ninja_run_adds_to_the_count() -> None:
    progress = cp.CompileProgress(started=0.0)
    for n in (1, 2, 3):
        progress.feed(status(n, 3, f"m1_{n}"), float(n))
    progress.feed(status(1, 2, "m2_1"), 4.0)
    assert (progress.done, progress.total) == (4, 5)


def test_prior_for_prefers_this_hosts_record_of_the_key() -> None:
    history = [{"key": "k", "max_jobs": 1, "unit_seconds": {"a": 3.0}},
               {"key": "other", "unit_seconds": {"a": 9.0}}]
    model = {"packages": {"flash-attn": {"measured": [
        {"version": "2.8.3", "cuda": "13.0", "wall_s": 100, "max_jobs": 2, "tus": 4}]}}}
    assert cp.prior_for("k", "flash-attn", "2.8.3", "13.0.2", 1, history, model).origin == \
        "history"
    assert cp.prior_for("new", "flash-attn", "2.8.3", "13.0.2", 1, history, model).origin == \
        "model"
    assert cp.prior_for("new", "flash-attn", "2.8.1", "13.0", 1, history, model).origin == \
        "uniform"


def test_without_a_terminal_a_plain_line_comes_every_interval() -> None:
    """watch.py: CI and nohup get one line per interval, with files and the ETA."""
    import time

    from infermatrix.watch import CompileWatch, Heartbeat

    said: list[str] = []
    with CompileWatch("cell: flash-attn", cp.Prior(), said.append, terminal=False,
                      every=0.2) as shown:
        shown.on_line(status(1, 4, "a"))
        time.sleep(0.7)
    assert said and all(line.startswith("cell: flash-attn: 1/4 files, ") for line in said)
    assert "ETA" in said[-1] and "(uniform)" in said[-1]
    beats: list[str] = []
    with Heartbeat("cell: image build", beats.append, every=0.2) as beat:
        beat.on_line("#7 12.0 Installed 151 packages in 8.31s\n")
        time.sleep(0.5)
    assert beats and beats[-1].startswith("cell: image build: still running, 0m00s elapsed")
    assert beats[-1].endswith("last: #7 12.0 Installed 151 packages in 8.31s")


def replay(lines: list[str], prior: cp.Prior) -> list[tuple[int, float, float]]:
    """(files done, ETA, real time left) after each status line, on BuildKit's own clock."""
    def at(line: str) -> float:
        return float(line.split()[1])

    progress, end, rows = cp.CompileProgress(prior=prior, started=0.0), at(lines[-1]), []
    for line in lines:
        progress.feed(line, at(line))
        if progress.done:
            rows.append((progress.done, progress.eta_s(at(line)), end - at(line)))
    return rows


def test_a_real_flashinfer_compiles_eta_is_within_a_quarter_by_half_way() -> None:
    """The status lines of the shipped SGLang sm_120 cell's FlashInfer 0.7.2 AOT compile, as
    this machine's build log recorded them (MAX_JOBS=2, 2 CPUs, 339 s; `measure`'s shortened
    lines): every edge is named apart, and from the half-way file on, the ETA from the model's
    prior is within 25 % of the time that was really left."""

    lines = (TESTS / "fixtures" / "compile-logs" /
             "flashinfer-0.7.2-cu130-sm120-2jobs.log").read_text().splitlines()
    model = cp.Prior.from_model({"wall_s": 336, "max_jobs": 1, "tus": 20}, max_jobs=2)
    rows = replay(lines, model)
    assert [r[0] for r in rows] == list(range(1, 20))
    names = [cp.parse_status(line)[2] for line in lines if cp.parse_status(line)]
    assert len(set(names)) == 19 and all(names)
    half = next(r for r in rows if r[0] >= 19 / 2)
    assert abs(half[1] - half[2]) <= 0.25 * half[2], half


def test_prior_for_takes_the_measurement_at_the_nearest_jobs_count() -> None:
    """A compile's wall time does not scale linearly from 16 jobs to 2: of several measured
    entries the one nearest this host's MAX_JOBS gives the forecast."""
    wide = {"version": "2.8.3", "cuda": "13.0", "wall_s": 714.6, "max_jobs": 16, "tus": 72}
    narrow = {"version": "2.8.3", "cuda": "13.0", "wall_s": 4245, "max_jobs": 2, "tus": 72}
    other = {"version": "2.8.2", "cuda": "13.0", "wall_s": 10, "max_jobs": 2, "tus": 72}
    model = {"packages": {"flash-attn": {"measured": [wide, other, narrow]}}}
    at_two = cp.prior_for("k", "flash-attn", "2.8.3", "13.0.2", 2, [], model)
    assert at_two.origin == "model" and at_two.total_s == pytest.approx(4245)
    at_twelve = cp.prior_for("k", "flash-attn", "2.8.3", "13.0.2", 12, [], model)
    assert at_twelve.total_s == pytest.approx(714.6 * 16 / 12)
    shipped = cp.prior_for("k", "flash-attn", "2.8.3", "13.0.2", 2, [], cp_model())
    assert shipped.total_s == pytest.approx(4245)  # data/compile_model.yaml's two-job entry
