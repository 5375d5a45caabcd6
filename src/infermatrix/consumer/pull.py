"""Pull a published cell by digest, checked against images.lock (its image id, digest and
labels), and the `docker run` line that serves it on the consumer's host."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable

from ..engine import registry as registries
from ..engine.docker import Engine
from ..model.spec import DEFAULT_PORT, DEFAULT_SHM
from ..stages.publish import CONTAINER_MODEL_DIR, infermatrix_labels
from ..watch import Heartbeat

def verify_pulled(entry: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """Differences between a pulled image and its lock entry (empty: it is the one)."""
    problems = []
    if info.get("Id") != entry["image_id"]:
        problems.append(f"image id {info.get('Id')} is not the locked {entry['image_id']}")
    if entry["reference"] not in (info.get("RepoDigests") or []):
        problems.append(f"digest {entry['digest']} is not among {info.get('RepoDigests')}")
    labels = infermatrix_labels((info.get("Config") or {}).get("Labels"))
    if labels != entry["labels"]:
        changed = sorted(k for k in set(labels) | set(entry["labels"])
                         if labels.get(k) != entry["labels"].get(k))
        problems.append(f"labels differ from images.lock: {', '.join(changed)}")
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
               say: Callable[[str], None] = print, docker: Engine | None = None
               ) -> dict[str, Any]:
    """Pull a locked cell by digest into `docker` (default DOCKER_HOST / the current context)
    with publish's credentials (`registries.credentials_for`),
    after `host_check(entry, labels)` (which raises when this host cannot run it) and, with
    `verify` (sign.VerifyOptions), after its signature and test result verify."""
    creds = creds or registries.credentials_for(entry["repository"])
    labels = remote_labels(entry, creds)
    if verify is not None:
        from ..stages import sign
        sign.verify_signatures(entry, verify, creds, say)
    if host_check is not None:
        host_check(entry, labels)
    with Heartbeat(f"pull of {entry['reference']}"):
        info = registries.pull_by_digest(docker or Engine(), entry["repository"],
                                         entry["digest"], creds)
    problems = verify_pulled(entry, info)
    if problems:
        raise registries.DigestMismatch(
            f"pulled {entry['reference']} does not match images.lock: {'; '.join(problems)}")
    return info


def docker_run_argv(entry: dict[str, Any], model_dir: str, port: int | None = None,
                    devices: list[str] | None = None, name: str | None = None) -> list[str]:
    """`docker run` for a locked image: by digest, GPUs, shm, the model mounted read-only."""
    run = entry["run"]
    port = port or run.get("port", DEFAULT_PORT)
    argv = ["docker", "run", "--rm", "--name", name or f"infermatrix-{entry['cell']}"]
    if run.get("gpu"):
        argv += ["--gpus", "all"]
    for device in devices or []:
        argv += ["--device", device]
    argv += ["--shm-size", run.get("shm_size", DEFAULT_SHM["gpu"]), "-p", f"{port}:{port}",
             "-v", f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"]
    for key, value in sorted(run.get("env", {}).items()):
        argv += ["-e", f"{key}={value}"]
    argv.append(entry["reference"])
    return argv + serve_command(entry, port, model_dir)


def serve_command(entry: dict[str, Any], port: int, model_dir: str | Path | None = None
                  ) -> list[str]:
    """The locked image's serve command (spec.locked_command: `{port}` and `{model}` filled,
    its MTP flags when `model_dir` holds the MTP head's weights)."""
    from ..model.spec import locked_command

    return locked_command(entry["run"], port, model_dir, CONTAINER_MODEL_DIR)


def docker_run_line(entry: dict[str, Any], model_dir: str, port: int | None = None,
                    devices: list[str] | None = None) -> str:
    return shlex.join(docker_run_argv(entry, model_dir, port, devices))
