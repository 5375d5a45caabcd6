"""verify-repro: the file-by-file comparison (pure, on tar archives made here). The real
no-cache builds (without the repro block they differ, with templates/blocks/repro.j2 they are
identical) are tests/docker/test_repro_docker.py."""

from __future__ import annotations

from tests.paths import TESTS

import hashlib

import io
import tarfile
from pathlib import Path

import pytest

from infermatrix.reproducibility import repro
from tests.support.cuda_tools import NO_NVCC, NVCC


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


def _manifest(members) -> dict[str, repro.ImageFile]:
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
