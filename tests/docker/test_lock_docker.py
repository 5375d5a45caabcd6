"""A lock installs in an image exactly as the templates install it (uv, --require-hashes,
--no-deps), and a lock with a tampered hash makes the build fail: real BuildKit builds on the
debootstrap base, through engine.build_image, against PyPI."""

from __future__ import annotations

from tests.paths import REPO

import re
import shutil
from pathlib import Path

import pytest

from infermatrix.engine import docker as engine
from infermatrix.stages import lock
from infermatrix.errors import CommandFailed

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

ROOT = REPO
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

DOCKERFILE = """\
FROM {base}
COPY with-secrets /usr/local/bin/with-secrets
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/uv \\
    python3 -m venv /opt/uv \\
 && with-secrets /opt/uv/bin/pip install --no-cache-dir uv=={uv} \\
 && ln -s /opt/uv/bin/uv /usr/local/bin/uv \\
 && uv venv --python 3.11 /opt/venv
COPY requirements.lock.txt /opt/infermatrix/requirements.lock.txt
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/uv \\
    with-secrets uv pip install --require-hashes --no-deps \\
        -r /opt/infermatrix/requirements.lock.txt \\
 && python3 -c "import six; print('six', six.__version__)"
"""


def _context(tmp_path: Path, base: str, lock_text: str, name: str) -> Path:
    context = tmp_path / name
    context.mkdir()
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=base, uv=lock.uv_version()))
    shutil.copy(ROOT / "templates" / "files" / "with-secrets.sh.j2", context / "with-secrets")
    (context / "with-secrets").chmod(0o755)
    (context / "requirements.lock.txt").write_text(lock_text)
    return context


@pytest.mark.docker
@pytest.mark.network
def test_tampered_lock_fails_the_image_build(tmp_path, built_base):
    inputs = lock.LockInputs(
        cell_id="tiny", python="3.11", platform="x86_64-manylinux_2_36",
        platform_reason="base bookworm: glibc 2.36", index_url="https://pypi.org/simple",
        extra_index_urls=(), requirements=("six==1.16.0",), no_deps=(), kernels=(),
        uv_version=lock.uv_version())
    result = lock.resolve_inputs(inputs)
    assert result.status == "locked"
    good_text = result.text or ""
    secrets = {"ca_bundle": CA_BUNDLE}
    tag = "infermatrix-test/lock-tamper:good"
    image = DOCKER.build_image(engine.BuildRequest(
        _context(tmp_path, built_base, good_text, "good"), tag=tag, secrets=secrets),
        log_path=tmp_path / "good.log")
    try:
        container = DOCKER.run_container(engine.ContainerSpec(
            image, ["python3", "-c", "import six; print('six', six.__version__)"]))
        try:
            assert DOCKER.wait_container(container, timeout=120) == 0
            assert "six 1.16.0" in DOCKER.container_logs(container)
        finally:
            DOCKER.remove_container(container)
    finally:
        DOCKER.remove_image(tag)
    bad_text = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, good_text)
    assert bad_text != good_text
    with pytest.raises(CommandFailed) as failure:
        DOCKER.build_image(engine.BuildRequest(
            _context(tmp_path, built_base, bad_text, "bad"),
            tag="infermatrix-test/lock-tamper:bad", secrets=secrets),
            log_path=tmp_path / "bad.log")
    log = (tmp_path / "bad.log").read_text().lower()
    assert "hash mismatch" in log and "six" in failure.value.log_tail
    assert "six 1.16.0" not in log
    assert not DOCKER.image_exists("infermatrix-test/lock-tamper:bad")
