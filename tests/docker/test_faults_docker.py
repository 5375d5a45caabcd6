"""Faults survived, each for real (issue 17): a concurrent pipeline, SIGKILLs of infermatrix,
a SIGKILLed dockerd, a registry killed mid-push, a disk that fills during a build.

The cells are the fault matrix of tests/support/fault_support.py (tiny, on the test matrix's base).
The dockerd and disk tests run a second, private dockerd of their own (own data root on a
tmpfs, own socket, exec root and pidfile, own bridge, no iptables) reached through DOCKER_HOST:
only that one is killed, never the machine's engine. Needs root (dockerd, mount).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

from infermatrix.engine import docker as engine

from tests.support.dockerd_support import PrivateDockerd, wait_for
from tests.support.fault_support import cell_id, remove_images, write_fault_matrix

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PYTHON = [sys.executable, "-m", "infermatrix"]


def infermatrix(*args: str, env: dict[str, str] | None = None, timeout: float = 600
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYTHON, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*PYTHON, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})


def records(state: Path) -> dict[str, dict]:
    """Every journal record; json.loads fails the test on a half-written one."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((state / "journal").glob("*.json"))}


def stage(state: Path, cell: str, name: str) -> str | None:
    return records(state).get(cell, {}).get("stages", {}).get(name, {}).get("status")


def _lock_held(state: Path) -> bool:
    lock = state / "run.lock"
    return lock.is_file() and lock.read_text().startswith("pid ")


# --------------------------------------------------------------------------------------------
# On the machine's engine
# --------------------------------------------------------------------------------------------

def test_two_pipelines_on_one_state_dir(built_base, tmp_path: Path) -> None:
    name, repository = "busy", f"im17-fault-{uuid.uuid4().hex[:8]}"
    matrix = write_fault_matrix(tmp_path / "m", {name: {"FAULT_SLEEP": "8",
                                                        "FAULT_TOKEN": uuid.uuid4().hex}},
                                repository=repository)
    state = tmp_path / "state"
    args = ["pipeline", "--matrix", str(matrix), "--state-dir", str(state), "--no-publish"]
    first = start(*args)
    try:
        wait_for(lambda: _lock_held(state), 120, "the first pipeline to take the lock")
        refused = infermatrix(*args)
        assert refused.returncode == 2, refused.stderr
        assert "is in use by pid" in refused.stderr and "--wait" in refused.stderr
        waiting = start(*args, "--wait")
        time.sleep(2)
        assert waiting.poll() is None  # still waiting behind the first one
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, err[-3000:]
        out, err = waiting.communicate(timeout=600)
        assert waiting.returncode == 0, err[-3000:]
        assert "reused" in err or "unchanged" in err or "pass" in err
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
    assert stage(state, cell_id(name), "tag") == "pass"
    remove_images(engine.Engine(), [cell_id(name)], [repository])


def test_sigkill_at_random_points_20_times(built_base, tmp_path: Path) -> None:
    """SIGKILL of the infermatrix process at a random moment of a pipeline run, 20 times;
    each time the journal holds only whole records and a rerun finishes and tags the cell.
    Every fifth round the matrix changes, so kills also land in render and build."""
    name = "victim"
    state = tmp_path / "state"
    rng = random.Random(1717)
    root = tmp_path / "m"
    matrix = root / "matrix.yaml"
    args = ["pipeline", "--matrix", str(matrix), "--state-dir", str(state), "--no-publish"]
    killed_in: list[str] = []
    repositories: list[str] = []
    last_run_s = 30.0  # a first run builds; later ones take what the last rerun took
    image_ids: set[str] = set()
    for round_ in range(20):
        if round_ % 5 == 0:  # a new token: a new Dockerfile, a real rebuild (and a new tag)
            repositories.append(f"im17-fault-{uuid.uuid4().hex[:8]}")
            write_fault_matrix(root, {name: {"FAULT_SLEEP": "3", "FAULT_TOKEN": uuid.uuid4().hex}},
                               repository=repositories[-1])
        victim = start(*args)
        time.sleep(rng.uniform(0.2, 0.8 * last_run_s))  # somewhere inside the run
        running = [s for s, r in records(state).get(cell_id(name), {}).get("stages", {}).items()
                   if r.get("status") == "running"]
        victim.send_signal(signal.SIGKILL)
        victim.communicate()
        killed_in.append(f"{round_}: rc {victim.returncode} running {running}")
        records(state)  # every record parses: none half-written
        started = time.monotonic()
        rerun = infermatrix(*args)
        last_run_s = time.monotonic() - started
        assert rerun.returncode == 0, f"round {round_}: {rerun.stderr[-3000:]}"
        record = records(state)[cell_id(name)]
        assert record["stages"]["build"]["status"] == "pass"
        assert record["stages"]["tag"]["status"] == "pass", record["stages"]["tag"]
        image_ids.add(record["image_id"])
        assert not [p for p in (root / "images").iterdir() if p.name.startswith(".")]
    print("\n".join(killed_in))
    assert sum(" rc -9 " in line for line in killed_in) >= 12  # the kills landed mid-run
    _remove_containers_of(image_ids)  # a SIGKILLed smoke cannot remove its container itself
    remove_images(engine.Engine(), [cell_id(name)], repositories)


def _remove_containers_of(images: set[str]) -> None:
    """Containers that killed runs left, of the images this test built."""
    listing = subprocess.run(["docker", "ps", "-a", "--format", "{{.ID}} {{.Image}}"],
                             capture_output=True, text=True).stdout.split("\n")
    for line in filter(None, listing):
        container, image = line.split(" ", 1)
        full = subprocess.run(["docker", "inspect", "--format", "{{.Image}}", container],
                              capture_output=True, text=True).stdout.strip()
        if full in images or image in images:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True)


# --------------------------------------------------------------------------------------------
# A registry killed mid-push
# --------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Registry:
    """Debian's docker-registry on a private loopback port, storage under `root`."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, _free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = {"version": 0.1, "log": {"level": "warn"},
                  "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                  "http": {"addr": self.host}}
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")],
                                     stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, 30, "the registry to answer")

    def _answers(self) -> bool:
        try:
            return requests.get(f"http://{self.host}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def uploads(self) -> int:
        """Bytes of blobs received so far (finished and in-progress uploads)."""
        data = self.root / "data"
        return sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) if data.exists() else 0

    def tags(self, repository: str) -> list[str]:
        answer = requests.get(f"http://{self.host}/v2/{repository}/tags/list", timeout=5)
        return (answer.json().get("tags") or []) if answer.status_code == 200 else []


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    if not shutil.which("docker-registry"):
        pytest.fail("needs Debian's docker-registry (apt install docker-registry)")
    reg = Registry(tmp_path / "registry")
    reg.start()
    yield reg
    if reg.proc and reg.proc.poll() is None:
        reg.proc.kill()
        reg.proc.wait()


def test_registry_killed_mid_push(built_base, registry: Registry, tmp_path: Path) -> None:
    name, repository = "pushed", f"im17-fault-{uuid.uuid4().hex[:8]}"
    matrix = write_fault_matrix(tmp_path / "m", {name: {"FAULT_TOKEN": uuid.uuid4().hex,
                                                        "FAULT_FILL_MB": "64"}},
                                registry=registry.host, repository=repository)
    state = tmp_path / "state"
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    built = infermatrix("pipeline", *common, "--no-publish")
    assert built.returncode == 0, built.stderr[-3000:]
    images_lock = tmp_path / "m" / "images.lock"
    push = start("publish", *common)
    wait_for(lambda: registry.uploads() > 1_000_000 or push.poll() is not None, 300,
             "the push to send data")
    assert push.poll() is None, "the push finished before the registry could be killed"
    registry.kill()
    out, err = push.communicate(timeout=300)
    print(f"publish, registry killed: rc {push.returncode}\n{(out + err)[-800:]}")
    # 5: the daemon's error said the registry went away (RegistryUnreachable); 1: another failure
    assert push.returncode in (1, 5), err[-3000:]
    assert "Traceback" not in err
    lock = yaml.safe_load(images_lock.read_text()) if images_lock.is_file() else {}
    assert cell_id(name) not in (lock or {}).get("images", {})  # nothing recorded that did not land
    registry.start()
    assert cell_id(name) not in registry.tags(repository)
    again = infermatrix("publish", *common)
    assert again.returncode == 0, again.stderr[-3000:]
    entry = yaml.safe_load(images_lock.read_text())["images"][cell_id(name)]
    assert entry["reference"].startswith(f"{registry.host}/{repository}@sha256:")
    assert cell_id(name) in registry.tags(repository)
    remove_images(engine.Engine(), [cell_id(name)], [repository, f"{registry.host}/{repository}"])


# --------------------------------------------------------------------------------------------
# A private dockerd: killed mid-build; a disk that fills
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def private_dockerd(built_base) -> Iterator[PrivateDockerd]:
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        pytest.fail("the private-dockerd fault tests need root and dockerd")
    daemon = PrivateDockerd("im17", "10.217.17.1/24", size_mb=900)
    try:
        daemon.start()
        daemon.load(built_base)
        yield daemon
    finally:
        daemon.stop()


def _journal_files_whole(state: Path) -> None:
    for path in (state / "journal").glob("*.json"):
        json.loads(path.read_text())


def test_dockerd_killed_mid_build_then_restarted(private_dockerd: PrivateDockerd,
                                                 tmp_path: Path) -> None:
    name = "interrupted"
    matrix = write_fault_matrix(tmp_path / "m", {name: {"FAULT_SLEEP": "20",
                                                        "FAULT_TOKEN": uuid.uuid4().hex}})
    state = tmp_path / "state"
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    env = private_dockerd.env
    assert infermatrix("render", *common, env=env).returncode == 0
    build = start("build", *common, env=env)
    log = state / "logs" / cell_id(name) / "build.log"
    wait_for(lambda: log.is_file() and "sleep 20 && echo built" in log.read_text(), 180,
             "the build to reach its slow RUN step")
    time.sleep(4)
    assert build.poll() is None and "ERROR" not in log.read_text(), log.read_text()[-2000:]
    private_dockerd.kill()
    out, err = build.communicate(timeout=300)
    print(f"build, dockerd killed: rc {build.returncode}\n{(out + err)[-800:]}")
    assert build.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    _journal_files_whole(state)
    record = records(state)[cell_id(name)]
    assert record["stages"]["build"]["status"] == "fail"  # not "pass", not left "running"
    assert record.get("image_id") is None
    private_dockerd.start()  # same data root: what BuildKit had cached survives
    rerun = infermatrix("build", *common, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    record = records(state)[cell_id(name)]
    assert record["stages"]["build"]["status"] == "pass"
    inspect = subprocess.run(["docker", "-H", private_dockerd.host, "image", "inspect",
                              "--format", "{{.Id}}", f"infermatrix-local/{cell_id(name)}:build"],
                             capture_output=True, text=True)
    assert inspect.stdout.strip() == record["image_id"]


def test_disk_fills_during_a_build(private_dockerd: PrivateDockerd, tmp_path: Path) -> None:
    """The state directory and Docker's data root share the private tmpfs; one cell writes
    more than is free. It fails with a "no space" line; the cell built before it and every
    journal record are intact; with space back, the rerun builds it."""
    state = private_dockerd.data / f"state-{uuid.uuid4().hex[:8]}"
    fill_mb = int(private_dockerd.free_mb()) + 50
    ok, big = "fits", "toobig"
    ok_env = {"FAULT_TOKEN": uuid.uuid4().hex}
    big_token = uuid.uuid4().hex
    matrix = write_fault_matrix(tmp_path / "m", {
        ok: ok_env, big: {"FAULT_TOKEN": big_token, "FAULT_FILL_MB": str(fill_mb)}})
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    env = private_dockerd.env
    assert infermatrix("render", *common, env=env).returncode == 0
    first = infermatrix("build", *common, "--select", f"*{ok}*", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    before = (state / "journal" / f"{cell_id(ok)}.json").read_bytes()
    full = infermatrix("build", *common, "--select", f"*{big}*", env=env)
    assert full.returncode == 1, full.stderr[-3000:]
    output = full.stdout + full.stderr
    print(f"build, disk full: rc {full.returncode}\n{output[-800:]}")
    assert "Traceback" not in output
    assert "no space left on device" in output.lower(), output[-3000:]
    _journal_files_whole(state)
    assert (state / "journal" / f"{cell_id(ok)}.json").read_bytes() == before
    record = records(state)[cell_id(big)]
    assert record["stages"]["build"]["status"] == "fail"
    assert "no space" in (record["stages"]["build"]["reason"] or "").lower()
    ok_image = subprocess.run(["docker", "-H", private_dockerd.host, "image", "inspect",
                               f"infermatrix-local/{cell_id(ok)}:build"], capture_output=True)
    assert ok_image.returncode == 0  # the other cell's image is untouched
    again = infermatrix("build", *common, "--select", f"*{ok}*", env=env)
    said = (again.stdout + again.stderr).lower()
    assert again.returncode == 0 and ("reused" in said or "unchanged" in said), said[-3000:]
    # with the space back (the cell now writes what fits), the rerun builds the failed cell
    write_fault_matrix(tmp_path / "m", {
        ok: ok_env, big: {"FAULT_TOKEN": big_token, "FAULT_FILL_MB": "20"}})
    assert infermatrix("render", *common, env=env).returncode == 0
    rebuilt = infermatrix("build", *common, "--select", f"*{big}*", env=env)
    assert rebuilt.returncode == 0, (rebuilt.stdout + rebuilt.stderr)[-3000:]
    record = records(state)[cell_id(big)]
    assert record["stages"]["build"]["status"] == "pass" and record.get("image_id")
    big_image = subprocess.run(["docker", "-H", private_dockerd.host, "image", "inspect",
                                "--format", "{{.Id}}", f"infermatrix-local/{cell_id(big)}:build"],
                               capture_output=True, text=True)
    assert big_image.stdout.strip() == record["image_id"]
    private_dockerd.docker("image", "rm", "--force", f"infermatrix-local/{cell_id(big)}:build")


def test_a_cell_short_of_disk_is_refused_before_it_starts(private_dockerd: PrivateDockerd,
                                                         tmp_path: Path) -> None:
    """build.disk.min_free_gib above what the private tmpfs holds: the engine's unused build
    cache is pruned (the real `docker builder prune`), then the cell fails before any build
    step ran, saying how much is free, where, and what it needs; exit 1, no image."""
    name = "needsroom"
    matrix = write_fault_matrix(tmp_path / "m", {name: {"FAULT_TOKEN": uuid.uuid4().hex}},
                                min_free_gib=2)  # the tmpfs is 900 MB
    state = tmp_path / "state"
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    env = private_dockerd.env
    assert infermatrix("render", *common, env=env).returncode == 0
    refused = infermatrix("build", *common, env=env)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 1, output[-3000:]
    assert "Traceback" not in output
    record = records(state)[cell_id(name)]["stages"]["build"]
    assert record["status"] == "fail"
    assert record["reason"].startswith("not started: ") and " GiB free under Docker's data " \
        f"root {private_dockerd.data / 'docker'}" in record["reason"], record["reason"]
    assert "needs 2 GiB (build.disk.min_free_gib)" in record["reason"]
    log = (state / "logs" / cell_id(name) / "build.log").read_text()
    assert "docker builder prune --all --force" in log and "#1 " not in log  # no build step
    inspect = subprocess.run(["docker", "-H", private_dockerd.host, "image", "inspect",
                              f"infermatrix-local/{cell_id(name)}:build"], capture_output=True)
    assert inspect.returncode != 0

