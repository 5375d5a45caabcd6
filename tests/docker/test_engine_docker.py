"""engine/docker.py against the real Docker engine: BuildKit client detection, a build with
secrets, args and labels, a target exported to a directory, a failed build's command and log
tail, a rootfs import (its pure helpers: tests/unit/engine/test_engine.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from infermatrix.engine import docker as engine
from infermatrix.errors import CommandFailed

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()


@pytest.fixture()
def scratch_tag():
    tag = f"infermatrix-test/engine-{uuid.uuid4().hex[:8]}:t"
    yield tag
    DOCKER.remove_image(tag, force=True)


# The classic builder refuses COPY --chmod: only a BuildKit build accepts this Dockerfile.
BUILDKIT_ONLY = "FROM scratch\nCOPY --chmod=0644 a.txt /a.txt\n"


def _build_with(client: engine.BuildClient, context: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*client.build_argv(), "--quiet", str(context)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **client.env()})


@pytest.mark.docker
def test_client_detection_picks_a_client_that_really_runs_buildkit(docker_available, tmp_path):
    """The chosen client builds a Dockerfile only BuildKit accepts; every client probe_client
    rejected fails that very build (e.g. a docker 28 CLI without the buildx plugin)."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(BUILDKIT_ONLY)
    (context / "a.txt").write_text("a\n")
    chosen = engine.build_client()
    built = _build_with(chosen, context)
    assert built.returncode == 0, built.stderr
    image_id = built.stdout.strip().splitlines()[-1]
    try:
        for binary in engine.candidate_clients():
            if engine.probe_client(binary) is None:
                refused = _build_with(engine.BuildClient(binary, "buildkit", "?"), context)
                assert refused.returncode != 0, f"{binary} was rejected but builds with BuildKit"
    finally:
        DOCKER.remove_image(image_id, force=True)


@pytest.mark.docker
def test_build_with_secret_args_labels_then_inspect_tag_copy_run(
        docker_available, built_base, scratch_tag, tmp_path, caplog):
    secret = tmp_path / "token.txt"
    secret.write_text("s3cr3t-value-never-logged\n")
    token_sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {built_base}\n"
        "ARG GREETING\n"
        "ARG TOKEN_SHA\n"
        "RUN --mount=type=secret,id=token echo \"$TOKEN_SHA  /run/secrets/token\" | sha256sum -c -"
        " && echo \"$GREETING\" > /greeting && mkdir -p /out && echo data > /out/file.txt\n"
        'CMD ["sh", "-c", "cat /greeting; echo to-stderr >&2; sleep 60"]\n')
    log_path = tmp_path / "build.log"
    with caplog.at_level(logging.INFO, logger="infermatrix.commands"):
        image_id = DOCKER.build_image(engine.BuildRequest(
            context, tag=scratch_tag, build_args={"GREETING": "hello", "TOKEN_SHA": token_sha},
            secrets={"token": secret}, labels={"io.infermatrix.test": "1"}),
            log_path=log_path, timeout=600)
    assert image_id.startswith("sha256:")
    assert DOCKER.image_id_of(scratch_tag) == image_id
    assert DOCKER.image_labels(scratch_tag)["io.infermatrix.test"] == "1"
    logged = log_path.read_text() + caplog.text
    assert f"id=token,src={secret}" in logged and "GREETING=hello" in logged
    assert "s3cr3t-value-never-logged" not in logged
    # The secret is not in any layer: the image's files do not hold it.
    copied = DOCKER.copy_from_image(image_id, ["/out", "/greeting", "/run/secrets/token",
                                               "/no/such/path"], tmp_path / "copied")
    assert (tmp_path / "copied" / "out" / "file.txt").read_text() == "data\n"
    assert (tmp_path / "copied" / "greeting").read_text() == "hello\n"
    assert "/no/such/path" not in copied
    secret_copy = tmp_path / "copied" / "token"
    assert not secret_copy.exists() or secret_copy.read_text() == ""

    other = scratch_tag.replace(":t", ":t2")
    DOCKER.tag_image(image_id, other)
    try:
        assert DOCKER.image_id_of(other) == image_id
    finally:
        assert DOCKER.remove_image(other)
    assert not DOCKER.remove_image(other)

    container = DOCKER.run_container(engine.ContainerSpec(
        image_id, env={"A": "1"}, shm_size="128m", labels={"io.infermatrix.test": "1"}))
    try:
        deadline = time.monotonic() + 30
        # both streams: the stderr line can land after the stdout one
        while not {"hello", "to-stderr"} <= set(DOCKER.container_logs(container).split()) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        logs = DOCKER.container_logs(container)
        assert "hello" in logs and "to-stderr" in logs
        assert DOCKER.container_status(container)["Status"] == "running"
        code, out = DOCKER.exec_in_container(container, ["sh", "-c", "echo $A; df -m /dev/shm"])
        assert code == 0 and out.startswith("1\n") and " 128 " in out
        DOCKER.stop_container(container, timeout=1)
        assert DOCKER.container_status(container)["Status"] == "exited"
    finally:
        DOCKER.remove_container(container)


@pytest.mark.docker
def test_target_stage_exported_to_a_local_directory(docker_available, built_base, tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "ARG BASE=scratch\n"
        f"FROM {built_base} AS compile-demo\n"
        "RUN mkdir -p /wheels && echo wheel > /wheels/demo-0.1-py3-none-any.whl\n"
        # Only the wheels: --output type=local exports the whole filesystem of the target.
        "FROM scratch AS kernel-demo\n"
        "COPY --from=compile-demo /wheels/ /wheels/\n"
        "FROM ${BASE} AS runtime\n"
        "COPY --from=kernel-demo /wheels /w\n")
    out = tmp_path / "out"
    assert DOCKER.build_image(engine.BuildRequest(
        context, target="kernel-demo", output_dir=out, build_args={"BASE": built_base}),
        timeout=600) == ""
    assert (out / "wheels" / "demo-0.1-py3-none-any.whl").read_text() == "wheel\n"


@pytest.mark.docker
def test_failed_build_carries_the_command_and_log_tail(docker_available, built_base, tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {built_base}\nRUN echo this-build-breaks-on-purpose && exit 7\n")
    with pytest.raises(CommandFailed) as failure:
        DOCKER.build_image(engine.BuildRequest(context), log_path=tmp_path / "b.log",
                           timeout=600)
    assert "this-build-breaks-on-purpose" in failure.value.log_tail
    assert "build" in failure.value.command and str(context) in failure.value.command


@pytest.mark.docker
def test_import_rootfs(docker_available, tmp_path, scratch_tag):
    import tarfile

    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "marker").write_text("imported\n")
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as archive:
        archive.add(rootfs, arcname=".")
    image_id = DOCKER.import_rootfs(tarball, scratch_tag, changes=['LABEL io.infermatrix.test="x"'])
    assert DOCKER.image_labels(image_id)["io.infermatrix.test"] == "x"
    DOCKER.copy_from_image(image_id, ["/etc/marker"], tmp_path / "got")
    assert (tmp_path / "got" / "marker").read_text() == "imported\n"
