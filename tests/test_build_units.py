"""Pure parts of build.py: Dockerfile stages, input hash, error lines (no Docker)."""

from __future__ import annotations

from infermatrix import build, kernelcache

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
    from infermatrix import engine
    from infermatrix.model import Cell, CellPlan, CellSettings

    def plan(platform: str) -> CellPlan:
        cell = Cell("13.0", "2.11.0", "vllm", "0.20.1", "sm_121")
        return CellPlan(cell, "planned", settings=CellSettings(
            python="3.12", base="b", engine_package="vllm", platform=platform))

    host = engine.host_platform()
    other = "linux/arm64" if host != "linux/arm64" else "linux/amd64"
    assert build.build_platform(plan(host)) is None
    assert build.build_platform(plan(other)) == other
    request = engine.BuildRequest(context_dir=".", platform=other)
    argv = request.argv(engine.BuildClient("/usr/bin/docker", "buildkit", "20.10.24"))
    assert argv[argv.index("--platform") + 1] == other
