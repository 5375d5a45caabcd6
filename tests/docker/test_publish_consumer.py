"""The consumer's path end to end, with real parts only: the CPU cell of the test matrix (built,
smoked and tagged for real) is published to a real docker-registry with htpasswd auth on
loopback; every local copy of the image is removed (by image id, not only its tags); `infermatrix
pull` brings it back by digest with nothing but INFERMATRIX_REGISTRY_USER/_PASSWORD (no `docker
login`: DOCKER_CONFIG is an empty directory); the pulled image id is the published one, and the
`model` smoke level passes against it. Publish signs the digest and attests its test result,
SBOM and provenance with a key pair made here; pull and deploy verify them against the public key
(issue 29). Then a wrong password and a stopped registry: one line and exit 1 each.

Slow (a ~7 GB image goes through the registry and back): minutes on two cores."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
import uuid

import pytest

from infermatrix.options import RunOptions
from infermatrix.engine import cosign
from infermatrix.model import spec
from infermatrix.stages import build, publish, render, smoke
from infermatrix.supplychain import sbom
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.engine import registry as registry_api
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.stages.plan import plan_matrix
from infermatrix.stages.tagging import tag_cell
from tests.support.planning_support import recorded_metadata
from tests.support.registry_support import SESSION_PASSWORD, SESSION_USER
from tests.docker.test_signing_registry import make_keys

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.registry, pytest.mark.slow]

CPU_ID = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
USER, PASSWORD = SESSION_USER, SESSION_PASSWORD
KEY_PASSWORD = "key-" + uuid.uuid4().hex[:12]


def tagged_cpu_plan(ctx: Context):
    """Plan, render, build (reused when built), smoke (reused when it passed on this image) and
    tag the CPU cell in the session's shared state."""
    (plan,) = plan_matrix(ctx, select=[CPU_ID], source=recorded_metadata)
    render.render_cells(ctx, [plan])
    built = build.build_cells(ctx, ctx.specs([plan]), RunOptions(wait=True), docker=DOCKER)[CPU_ID]
    assert built.status == "pass", built.reason
    record = journal.load(ctx.state, CPU_ID)
    smoked = record.get("stages", {}).get("smoke", {})
    if smoked.get("status") != "pass" or \
            (smoked.get("details") or {}).get("image_id") != record["image_id"]:
        assert smoke.smoke_cell(ctx, ctx.spec(plan), docker=DOCKER).status == "pass"
    decision = tag_cell(ctx, plan.cell, f"im20-consumer-{uuid.uuid4().hex[:6]}", docker=DOCKER)
    assert decision.allowed, decision.reason
    return plan


def wait_until_unused(image_id: str, timeout_s: float = 900) -> None:
    """On a shared engine another run's container may be using the cell's image (the same
    build gives the same id): wait for it to end rather than fail on the removal."""
    deadline = time.monotonic() + timeout_s
    while True:
        users = DOCKER.sdk().api.containers(filters={"ancestor": image_id})
        if not users:
            return
        if time.monotonic() > deadline:
            names = ", ".join(name for c in users for name in c.get("Names", []))
            pytest.fail(f"{image_id} is still used by running containers ({names}) of another "
                        "run on this Docker engine; the test must remove every local copy")
        time.sleep(10)


def only_line(err: str) -> str:
    """The one error line and its `  fix:` line (errors.py's form), as one string; a long
    step's progress line (watch.Heartbeat: `...: still running, 1m00s elapsed`, on stderr) is
    not an error."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and ": still running, " not in ln
             and "is NOT VERIFIED (--skip-verify)" not in ln]  # the warning --skip-verify gives
    assert len(lines) in (1, 2) and "Traceback" not in err, err
    assert len(lines) == 1 or lines[1].startswith("  fix: "), err
    return " ".join(lines)


def test_publish_remove_pull_by_digest_and_serve(tmp_path, built_base, test_ctx, monkeypatch,
                                                 capsys, caplog, session_registry):
    tagged_cpu_plan(test_ctx)
    server = session_registry  # the main job's test may have pushed these layers already
    lock_path = tmp_path / "images.lock"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty-docker-config"))  # no login
    (tmp_path / "empty-docker-config").mkdir()
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    restore: list[str] = []
    image_id = None
    try:
        # 1. publish the tagged CPU cell
        #    signed with a key pair made here (issue 29): key file and password by environment
        private, public = make_keys(tmp_path / "keys", KEY_PASSWORD)
        monkeypatch.setenv(cosign.KEY_FILE_ENV, str(private))
        monkeypatch.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
        code = main(["publish", "--matrix", str(test_ctx.matrix.path), "--state-dir",
                     str(test_ctx.state.root), "--select", CPU_ID, "--registry", server.host,
                     "--lock", str(lock_path), "--wait"])
        said = capsys.readouterr()
        out = said.out + said.err  # the publish step's lines are on stderr
        assert code == 0 and "published 1" in out and f"({CPU_ID}, signed)" in out, out
        monkeypatch.delenv(cosign.KEY_FILE_ENV)
        monkeypatch.delenv(cosign.PASSWORD_ENV)
        entry = publish.read_images_lock(lock_path)["images"][CPU_ID]
        image_id = entry["image_id"]
        assert entry["repository"].startswith(server.host + "/")
        assert entry["signing"]["verdict"] == "passed" and all(
            entry["signing"]["attestations"].values())
        # the attested SBOM of the real image: the lock's packages and the base's dpkg status
        document = (test_ctx.state.root / entry["signing"]["sbom_file"]).read_text()
        assert sbom.validation_error(document) is None
        refs = {c["bom-ref"] for c in json.loads(document)["components"]}
        lock_text = spec.lock_path(test_ctx, CPU_ID).read_text()
        assert all(f"pypi:{p.name.lower()}@{p.version}" in refs
                   for p in sbom.lock_packages(lock_text))
        assert any(ref.startswith("deb:libc6@") for ref in refs)
        history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", image_id],
                                 capture_output=True, text=True, check=True).stdout
        assert KEY_PASSWORD not in history and PASSWORD not in history
        for path in [lock_path, test_ctx.state.commands_log, test_ctx.state.journal,
                     test_ctx.state.root / entry["signing"]["sbom_file"]]:
            files = [path] if path.is_file() else list(path.rglob("*.json"))
            for found in files:
                assert KEY_PASSWORD.encode() not in found.read_bytes(), found

        # 2. remove every local copy: the image id itself, with every tag and digest naming it
        wait_until_unused(image_id)
        info = DOCKER.inspect_image(image_id)
        restore = [t for t in info.get("RepoTags") or [] if not t.startswith(server.host)]
        assert DOCKER.remove_image(image_id, force=True)
        assert DOCKER.inspect_image(image_id) is None
        assert DOCKER.inspect_image(entry["reference"]) is None

        # 3. pull by digest with the variables only
        caplog.set_level(logging.INFO, logger="infermatrix.commands")
        code = main(["pull", CPU_ID, "--key", str(public), "--lock", str(lock_path),
                     "--model-dir", "/srv/m"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"# verified {entry['reference']}" in out and "'passed'" in out
        assert any("docker pull " + entry["reference"] in r.getMessage()
                   for r in caplog.records)
        pulled = DOCKER.inspect_image(entry["reference"])
        assert pulled is not None and pulled["Id"] == image_id  # the published image id
        assert entry["reference"] in pulled["RepoDigests"]
        assert entry["reference"] in out.strip().splitlines()[-1]  # the docker run line
        code = main(["deploy", CPU_ID, "--key", str(public), "--matrix",
                     str(test_ctx.matrix.path), "--lock", str(lock_path), "--cpu-lane", "1",
                     "--model-dir", str(tmp_path), "--out", str(tmp_path / "deploy")])
        assert code == 0 and "# verified" in capsys.readouterr().out
        assert entry["reference"] in (tmp_path / "deploy" / "compose.yaml").read_text()

        # 4. the consumer's own verification of the pulled image, from images.lock alone:
        #    the model level with the serve command it recorded, on weights of a host
        #    directory (the tiny fixture, made by the image's own transformers: random
        #    weights, so the answers' structure is checked, not their meaning)
        weights = tmp_path / "consumer-weights"
        weights.mkdir()
        maker = smoke.Harness.for_image(DOCKER, pulled["Id"], tmp_path / "fixture.log")
        code, _, output = maker.run("make_fixture_model", ["--out", "/fixture/model"], 600,
                                    mounts=[engine.Mount(str(weights), "/fixture",
                                                         read_only=False)])
        assert code == 0, output[-2000:]
        verdict_path = tmp_path / "verdict.json"
        code = main(["verify", CPU_ID, "--key", str(public), "--lock", str(lock_path),
                     "--model-dir",
                     str(weights / "model"), "--no-answer-check", "--out", str(verdict_path)])
        out = capsys.readouterr().out
        verdict = json.loads(verdict_path.read_text())
        model = verdict["levels"]["model"]
        assert code == 0, model.get("engine_log_tail") or out
        assert verdict["image_id"] == image_id and verdict["status"] == "pass"
        assert verdict["levels"]["gpu"]["status"] == "skip"  # a CPU cell: n/a
        assert model["status"] == "pass" and model["answer_checked"] is False
        assert model["command"][:3] == entry["run"]["command"][:3]  # images.lock's command
        assert verdict["host"]["hostname"] and f"{CPU_ID}: pass on" in out

        # 4b. the job's shape on the consumer's host (issue 43): `verify --levels workload`
        #     runs the signed serve command on weights that end their thinking answers (the
        #     fixture trained in the pulled image), held to the figure the cell was published
        #     with (none here: the CI publish ran no workload level)
        trained = tmp_path / "consumer-trained"
        trained.mkdir()
        code, _, output = maker.run("make_fixture_model", ["--out", "/fixture/model",
                                                           "--trained"], 900,
                                    mounts=[engine.Mount(str(trained), "/fixture",
                                                         read_only=False)])
        assert code == 0, output[-2000:]
        work_path = tmp_path / "verdict-workload.json"
        code = main(["verify", CPU_ID, "--key", str(public), "--lock", str(lock_path),
                     "--model-dir", str(trained / "model"), "--no-answer-check",
                     "--levels", "workload", "--soak-s", "20", "--out", str(work_path)])
        out = capsys.readouterr().out
        work = json.loads(work_path.read_text())["levels"]["workload"]
        assert code == 0, work.get("reason") or work.get("engine_log_tail") or out
        assert work["status"] == "pass" and work["command"][:3] == entry["run"]["command"][:3]
        assert [p["concurrency"] for p in work["sweep"]["points"]] == [1, 4, 8]
        assert all(p["truncated"] == p["empty"] == p["errors"] == 0
                   for p in work["sweep"]["points"])
        assert work["soak"]["seconds"] >= 20 and work["soak"]["server_up"]
        assert work["needle"]["status"] == "pass" and work["backends"]["seen"]["gdn"] == ["cpu"]
        assert work["target"]["previous_tokens_per_s"] is None

        # 5. a wrong password: one line, exit 1
        monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, "wrong-" + PASSWORD)
        code = main(["pull", CPU_ID, "--skip-verify", "--lock", str(lock_path)])
        line = only_line(capsys.readouterr().err)
        assert code == 1 and "refused the credentials" in line and "fix:" in line
        assert PASSWORD not in line

        # 6. the registry stopped: one line (and its fix), exit 5
        monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
        server.stop()
        code = main(["pull", CPU_ID, "--skip-verify", "--lock", str(lock_path)])
        line = only_line(capsys.readouterr().err)
        assert code == 5 and "registry unreachable" in line and server.host in line
    finally:
        server.stop()
        if image_id and DOCKER.inspect_image(image_id) is not None:
            for ref in restore:  # the session's other tests find the cell under its tags
                DOCKER.tag_image(image_id, ref)
            info = DOCKER.inspect_image(image_id) or {}
            for ref in [r for r in (info.get("RepoTags") or []) + (info.get("RepoDigests") or [])
                        if r.startswith(server.host + "/")]:
                DOCKER.remove_image(ref)
        shutil.rmtree(server.root / "data", ignore_errors=True)  # GBs of layers
