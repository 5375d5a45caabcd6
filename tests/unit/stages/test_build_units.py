"""Pure parts of build.py: Dockerfile stages, input hash, error lines (no Docker)."""

from __future__ import annotations

from infermatrix.stages import build
from infermatrix.kernels import kernelcache

DOCKERFILE = """\
FROM base:1 AS toolchain
RUN echo toolchain

FROM toolchain AS compile-flash-attn
RUN make

FROM scratch AS kernel-flash-attn
# recipe sha256:abc
COPY --from=compile-flash-attn /wheels/ /wheels/

FROM scratch AS kernel-flashinfer
COPY --from=toolchain /wheels/ /wheels/

FROM scratch AS kernels-cached
COPY kernel-wheels/ /wheels/

FROM toolchain AS runtime
RUN true
"""


def test_kernel_stages_in_order_and_not_kernels_cached():
    assert build.kernel_stages(DOCKERFILE) == ["flash-attn", "flashinfer"]


def test_stage_text_is_one_stage():
    text = build.stage_text(DOCKERFILE, "kernel-flash-attn")
    assert text.startswith("FROM scratch AS kernel-flash-attn")
    assert "recipe sha256:abc" in text and "kernel-flashinfer" not in text
    assert build.stage_text(DOCKERFILE, "kernel-none") == ""


def _key(version: str = "1.0") -> kernelcache.KernelKey:
    return kernelcache.KernelKey("p", version, "2.11.0", "13.0", "3.12", ("sm_120",))


def test_input_hash_ignores_speed_only_args_but_not_others(tmp_path):
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    base = build.input_hash(tmp_path, {"MAX_JOBS": "2", "NVCC_THREADS": "2"}, {"k": _key()})
    assert base == build.input_hash(tmp_path, {"MAX_JOBS": "8", "NVCC_THREADS": "1"},
                                    {"k": _key()})
    assert base != build.input_hash(tmp_path, {"MAX_JOBS": "2", "EXTRA": "1"}, {"k": _key()})
    assert base != build.input_hash(tmp_path, {"MAX_JOBS": "2"}, {"k": _key("1.1")})


def test_input_hash_covers_every_context_file_and_the_exec_bit(tmp_path):
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "serve").write_text("#!/bin/sh\n")
    first = build.input_hash(tmp_path, {}, {})
    (tmp_path / "serve").chmod(0o755)
    second = build.input_hash(tmp_path, {}, {})
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("x")
    third = build.input_hash(tmp_path, {}, {})
    assert len({first, second, third}) == 3


def test_first_error_lines_find_the_cause_not_the_summary():
    log = "\n".join([
        "#11 14.82   Building wheel for x (pyproject.toml): started",
        "#11 15.00   error: subprocess-exited-with-error",
        "#11 15.00   src/a.cu:3:2: error: #error \"broken\"",
        "#11 15.00   src/a.cu:3:2: error: #error \"broken\"",
        "#11 ERROR: executor failed running [/bin/sh -c make]: exit code: 1",
    ])
    assert build.first_error_lines(log) == ['src/a.cu:3:2: error: #error "broken"']


def test_local_ref_is_not_publishable_looking():
    assert build.local_ref("cu130-torch2.11.0-vllm0.20.1-sm120") == \
        "infermatrix-local/cu130-torch2.11.0-vllm0.20.1-sm120:build"


def test_platform_flag_only_for_another_cpu():
    from pathlib import Path

    from infermatrix.engine import docker as engine
    from infermatrix.model.cell import Cell, CellPlan, CellSettings
    from infermatrix.model.spec import CellSpec, machine_of

    def spec(platform: str) -> CellSpec:
        cell = Cell("13.0", "2.11.0", "vllm", "0.20.1", "sm_121")
        plan = CellPlan(cell, "planned", settings=CellSettings(
            python="3.12", base="b", engine_package="vllm", platform=platform))
        return CellSpec(plan, platform, machine_of(platform), "3.12", "b", ("b",), "vllm", (),
                        Path("/nonexistent/uv.lock"))

    host = engine.host_platform()
    other = "linux/arm64" if host != "linux/arm64" else "linux/amd64"
    machine = engine.Engine()  # the default engine's platform is this host's: no Docker call
    assert build.build_platform(spec(host), machine) is None
    assert build.build_platform(spec(other), machine) == other
    request = engine.BuildRequest(context_dir=".", platform=other)
    argv = request.argv(engine.BuildClient("/usr/bin/docker", "buildkit", "20.10.24"))
    assert argv[argv.index("--platform") + 1] == other


def test_a_stated_failure_is_the_reason_not_the_echoed_command():
    log = ("#9 [toolchain 5/6] RUN python3 ... || { echo \"INFERMATRIX-FAIL: cannot reach X ($(tail"
           " -n 1 /tmp/e)); do Y\"; exit 1; }\n"
           "#9 5.997 INFERMATRIX-FAIL: cannot reach X (Name or service not known); do Y\n"
           "#9 ERROR: executor failed running\n")
    assert build.stated_failure(log) == "cannot reach X (Name or service not known); do Y"
    assert build.stated_failure("#9 5.9 error: something else\n") is None


def test_measure_stats_are_read_and_described(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "flash-attn.build-stats.json").write_text(
        '{"name": "flash-attn", "exit": 0, "seconds": 3600, "peak_rss_bytes": 8589934592,'
        ' "cgroup_peak_bytes": null, "max_jobs": "2", "nvcc_threads": "1"}')
    (tmp_path / "wheels" / "broken.build-stats.json").write_text("{")
    stats = kernelcache.read_build_stats(tmp_path)
    assert list(stats) == ["flash-attn"]
    assert kernelcache.describe_stats(stats["flash-attn"]) == (
        "3600 s, peak RSS 8.0 GiB, MAX_JOBS=2 NVCC_THREADS=1")


def _emulation_context(tmp_path, build_section: dict):
    from types import SimpleNamespace

    from infermatrix.state import StatePaths

    state = StatePaths(tmp_path / "state")
    matrix = SimpleNamespace(build=build_section)
    return SimpleNamespace(state=state, matrix=matrix)


def test_emulated_compile_is_refused_before_starting_with_estimate_and_alternatives(tmp_path):
    ctx = _emulation_context(tmp_path, {
        "kernels": {"flash-attn": {"estimate_minutes": 60}},
        "emulation": {"slowdown": 12, "max_compile_minutes": 60}})
    key = kernelcache.KernelKey("flash-attn", "2.8.3", "2.14.1", "13.0", "3.11", ("sm_121",),
                                platform="linux/arm64")
    reason = build.emulated_compile_refusal(ctx, {"flash-attn": key}, "linux/arm64")
    assert reason is not None
    assert "flash-attn ~12.0 h (60 min natively, build.kernels.flash-attn.estimate_minutes" in reason
    assert "native linux/arm64 builder" in reason and "--driver remote" in reason
    assert build.emulated_compile_refusal(ctx, {"flash-attn": key}, None) is None


def test_emulated_compile_uses_the_measured_native_time_and_the_cache(tmp_path):
    ctx = _emulation_context(tmp_path, {"emulation": {"slowdown": 10, "max_compile_minutes": 60}})
    native = kernelcache.KernelKey("flashinfer-python", "0.7.2", "2.14.1", "13.0", "3.11",
                                   ("sm_120",))
    wheel = tmp_path / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"w")
    kernelcache.store(ctx.state, native, [wheel], details={"stats": {"seconds": 300}})
    arm = kernelcache.KernelKey("flashinfer-python", "0.7.2", "2.14.1", "13.0", "3.11",
                                ("sm_121",), platform="linux/arm64")
    # 300 s natively x10 = 50 min: under the limit, so it compiles
    assert build.emulated_compile_refusal(ctx, {"flashinfer": arm}, "linux/arm64") is None
    ctx.matrix.build["emulation"]["max_compile_minutes"] = 30
    reason = build.emulated_compile_refusal(ctx, {"flashinfer": arm}, "linux/arm64")
    assert reason and "flashinfer ~0.8 h (5 min natively, measured here" in reason
    kernelcache.store(ctx.state, arm, [wheel])  # in the cache: nothing to compile
    assert build.emulated_compile_refusal(ctx, {"flashinfer": arm}, "linux/arm64") is None


def test_a_failed_build_is_said_by_its_exit_a_full_disk_or_its_error(tmp_path):
    from types import SimpleNamespace

    from infermatrix.errors import CommandFailed, StageFailure

    ctx = SimpleNamespace(state=SimpleNamespace(root=tmp_path / "state"))
    log = tmp_path / "build.log"
    log.write_text("step 1\nerror: the cause\n")
    full = CommandFailed("docker build .", 1, "write: no space left on device")
    assert build._failure_of(full, ctx, log) == {
        "reason": "build exited 1: no space left on device (free space under Docker's data "
                  f"root and {tmp_path / 'state'}, then rerun)",
        "command": "docker build .", "log_tail": "write: no space left on device"}
    assert build._failure_of(CommandFailed("docker build .", None, ""), ctx, log)["reason"] \
        == "timed out"
    other = build._failure_of(StageFailure("stage kernel-k left no wheel"), ctx, log)
    assert other["reason"] == "stage kernel-k left no wheel" and "the cause" in other["log_tail"]
