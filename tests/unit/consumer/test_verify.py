"""`infermatrix verify` (consumer/verify.py): the consumer's check of a pulled image. Usage errors
here, no Docker (an image not pulled: tests/docker/test_verify_docker.py); the real run is in
tests/docker/test_publish_consumer.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.stages import publish

CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


def lock_of_an_image_nobody_pulled(tmp_path: Path) -> Path:
    """images.lock naming one CPU cell at a digest no engine holds."""
    lock = publish.empty_images_lock()
    lock["images"][CELL] = {"cell": CELL, "arch": "cpu",
                            "reference": "localhost:1/infermatrix-test/none@sha256:" + "0" * 64,
                            "image_id": "sha256:" + "1" * 64, "digest": "sha256:" + "0" * 64,
                            "run": {"command": ["python3", "-m", "x"], "gpu": False}}
    path = tmp_path / "images.lock"
    publish.write_images_lock(path, lock)
    return path


@pytest.fixture
def lock(tmp_path):
    return lock_of_an_image_nobody_pulled(tmp_path)


@pytest.mark.parametrize("extra, words", [
    (["--levels", "gpu,perf"], "expected a comma-separated subset of gpu,model"),
    (["--lock", "/no/such/images.lock"], "does not exist"),
    (["--model-dir", "/no/such/dir"], "is not a directory"),
])
def test_bad_input_exits_2(lock, tmp_path, capsys, extra, words):
    args = ["verify", CELL, "--lock", str(lock), "--model-dir", str(tmp_path), *extra]
    assert main(args) == 2
    assert words in capsys.readouterr().err


def test_an_unknown_cell_exits_2(lock, tmp_path, capsys):
    assert main(["verify", "no-such-cell", "--lock", str(lock), "--model-dir",
                 str(tmp_path)]) == 2
    assert "no-such-cell" in capsys.readouterr().err


def test_an_image_for_another_cpu_is_not_run_under_emulation(tmp_path):
    """RecordingEngine (FAKE: no container may start, and none does). A consumer verifying a
    GB10 (linux/arm64) image on an x86_64 host with a GPU: no level starts the image's
    programs under QEMU (`import torch` crashes there); each says where it can run."""
    from infermatrix.consumer.verify import Request, verify_entry
    from infermatrix.engine.docker import host_platform
    from infermatrix.levels import ALL_VERIFY_LEVELS
    from tests.support.recording_engine import RecordingEngine

    arch = "amd64" if host_platform() == "linux/arm64" else "arm64"
    image_id = "sha256:" + "1" * 64
    reference = "localhost:1/infermatrix-test/gb10@sha256:" + "0" * 64
    fake = RecordingEngine()
    fake.images[image_id] = {"Id": image_id, "Os": "linux", "Architecture": arch,
                             "Config": {"Labels": {}}}
    fake.tags[reference] = image_id
    entry = {"cell": "cu130-torch2.14.0-vllm0.33.0-sm121", "arch": "sm_121",
             "reference": reference, "image_id": image_id,
             "labels": {"io.infermatrix.engine": "vllm"},
             "run": {"command": ["vllm", "serve"], "gpu": True, "health": "/health"}}
    verdict = verify_entry(Request(entry, tmp_path, tmp_path / "verify.log",
                                   levels=list(ALL_VERIFY_LEVELS)), fake, gpu_here=True)
    assert fake.named("run_container") == []
    assert verdict["emulated"] == f"linux/{arch} under QEMU on {host_platform()}"
    assert list(verdict["levels"]) == list(ALL_VERIFY_LEVELS)  # each row's function ran
    for level in ALL_VERIFY_LEVELS:
        got = verdict["levels"][level]
        assert got["status"] == "skip" and got["emulated"] == verdict["emulated"], got
        assert f"run `infermatrix verify` on a linux/{arch} host" in got["reason"]
    assert verdict["status"] == "skip"


def test_verify_without_a_key_or_the_skip_flag_exits_2_before_anything_runs(lock, tmp_path,
                                                                            capsys, monkeypatch):
    """verify verifies like pull: no key and no --skip-verify is a usage error, nothing run."""
    monkeypatch.delenv("INFERMATRIX_COSIGN_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("INFERMATRIX_COSIGN_KEYLESS", raising=False)
    out = tmp_path / "v.json"
    assert main(["verify", CELL, "--lock", str(lock), "--model-dir", str(tmp_path),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no public key" in err and "--skip-verify" in err and not out.exists()
