"""Pull a published cell by digest, checked against images.lock (its image id, digest and
labels), and the `docker run` line that serves it on the consumer's host."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Callable

from ..engine import registry as registries
from ..engine.docker import Engine
from ..model.spec import DEFAULT_PORT, DEFAULT_SHM
from ..stages.publish import CONTAINER_MODEL_DIR, infermatrix_labels
from ..watch import Heartbeat

def label_problems(entry: dict[str, Any], labels: dict[str, str] | None) -> list[str]:
    """The io.infermatrix labels where an image's (`labels`) differ from the entry's."""
    found = infermatrix_labels(labels)
    wanted = entry.get("labels") or {}
    if found == wanted:
        return []
    changed = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
    source = "the signed statement" if entry.get("verified_by") else "images.lock"
    return [f"labels differ from {source}: "
            + ", ".join(f"{k} {found.get(k)!r} (expected {wanted.get(k)!r})" for k in changed)]


def verify_pulled(entry: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """Differences between a pulled image and its lock entry (empty: it is the one)."""
    problems = []
    if info.get("Id") != entry["image_id"]:
        problems.append(f"image id {info.get('Id')} is not the locked {entry['image_id']}")
    if entry["reference"] not in (info.get("RepoDigests") or []):
        problems.append(f"digest {entry['digest']} is not among {info.get('RepoDigests')}")
    problems += label_problems(entry, (info.get("Config") or {}).get("Labels"))
    return problems


def remote_labels(entry: dict[str, Any], creds: registries.RegistryCredentials
                  ) -> dict[str, str]:
    """The labels of the locked image, read from the registry before any layer moves; checks
    the credentials, the connection and that the digest still holds the locked image id."""
    config = registries.remote_image_config(entry["repository"], entry["digest"], creds,
                                            expect_id=entry.get("image_id"))
    return dict(((config or {}).get("config") or {}).get("Labels") or {})


HostChecker = Callable[[dict[str, Any], dict[str, str]], None]


def pull_entry(entry: dict[str, Any], creds: registries.RegistryCredentials | None = None,
               host_check: HostChecker | None = None, verify: Any = None,
               say: Callable[[str], None] = print, *, docker: Engine) -> dict[str, Any]:
    """Pull a locked cell by digest into `docker` with publish's credentials
    (`registries.credentials_for`); `entry` is what the consumer acts on
    (sign.verified_entry: the signed statement, or images.lock's entry unverified).
    Before any layer moves: the registry's config of the digest holds the entry's image id
    and labels, and `host_check(entry, labels)` passes (it raises when this host cannot run
    it). `verify` (sign.VerifyOptions): verify `entry` here first (for a caller that has not)."""
    creds = creds or registries.credentials_for(entry["repository"])
    if verify is not None:
        from ..supplychain import sign
        entry = sign.verified_entry(entry["cell"], entry, verify, creds, say)
    labels = remote_labels(entry, creds)
    problems = label_problems(entry, labels)
    if problems:  # nothing pulled
        raise registries.DigestMismatch(
            f"{entry['cell']} ({entry['digest']}): the registry's image config of "
            f"{entry['reference']} does not match: {'; '.join(problems)}")
    if host_check is not None:
        host_check(entry, labels)
    with Heartbeat(f"pull of {entry['reference']}"):
        info = registries.pull_by_digest(docker, entry["repository"],
                                         entry["digest"], creds)
    problems = verify_pulled(entry, info)
    if problems:
        raise registries.DigestMismatch(
            f"pulled {entry['reference']} does not match images.lock: {'; '.join(problems)}")
    return info


def docker_run_argv(entry: dict[str, Any], model_dir: str, port: int | None = None,
                    devices: list[str] | None = None, name: str | None = None,
                    bind: str = "127.0.0.1") -> list[str]:
    """`docker run` for a locked image: by digest, GPUs, shm, the model mounted read-only, the
    port published on `bind` only (the server has no authentication: loopback by default)."""
    run = entry["run"]
    port = port or run.get("port", DEFAULT_PORT)
    argv = ["docker", "run", "--rm", "--name", name or f"infermatrix-{entry['cell']}"]
    if run.get("gpu"):
        argv += ["--gpus", "all"]
    for device in devices or []:
        argv += ["--device", device]
    argv += ["--shm-size", run.get("shm_size", DEFAULT_SHM["gpu"]),
             "-p", f"{bind}:{port}:{port}",
             "-v", f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"]
    for key, value in sorted(run.get("env", {}).items()):
        argv += ["-e", f"{key}={value}"]
    argv.append(entry["reference"])
    here = os.path.expanduser(os.path.expandvars(model_dir))  # where the MTP head is looked for
    return argv + serve_command(entry, port, here)


def serve_command(entry: dict[str, Any], port: int, model_dir: str | Path | None = None
                  ) -> list[str]:
    """The locked image's serve command (spec.locked_command: `{port}` and `{model}` filled,
    its MTP flags when `model_dir` holds the MTP head's weights)."""
    from ..model.spec import locked_command

    return locked_command(entry["run"], port, model_dir, CONTAINER_MODEL_DIR)


HOME_PREFIXES = ("$HOME/", "${HOME}/", "~/")


def shell_word(text: str) -> str:
    """`text` quoted for a POSIX shell; a leading $HOME/ (or ~/) stays expandable: "$HOME"/'rest'
    works when pasted, where '$HOME/rest' would name a directory called $HOME."""
    for prefix in HOME_PREFIXES:
        if text.startswith(prefix):
            rest = text[len(prefix):]
            return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(text)


def docker_run_line(entry: dict[str, Any], model_dir: str, port: int | None = None,
                    devices: list[str] | None = None, bind: str = "127.0.0.1") -> str:
    """The line to paste: every word quoted, the model directory's $HOME expandable."""
    argv = docker_run_argv(entry, model_dir, port, devices, bind=bind)
    volume = f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"
    return " ".join(shell_word(model_dir) + shlex.quote(f":{CONTAINER_MODEL_DIR}:ro")
                    if word == volume else shlex.quote(word) for word in argv)
