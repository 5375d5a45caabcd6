"""The engine's pure helpers (engine/docker.py and its parts), no Docker (against the real engine:
tests/docker/test_engine_docker.py)."""

from __future__ import annotations

import subprocess

from infermatrix.engine import docker as engine

# ---- pure helpers -----------------------------------------------------------------------------


def test_parse_client_version():
    assert engine.parse_client_version("Docker version 20.10.24+dfsg1, build 297e128") == \
        "20.10.24+dfsg1"
    assert engine.parse_client_version("Docker version 28.2.2, build e6534b4") == "28.2.2"
    assert engine.parse_client_version("garbage") is None


def test_only_pre_23_clients_have_builtin_buildkit():
    assert engine.classic_builder_has_buildkit("20.10.24+dfsg1")
    assert not engine.classic_builder_has_buildkit("28.2.2")
    assert not engine.classic_builder_has_buildkit("23.0.0")


def test_build_argv_names_secret_ids_and_files_never_contents(tmp_path):
    secret = tmp_path / "bundle.pem"
    secret.write_text("-----BEGIN CERTIFICATE----- top secret")
    request = engine.BuildRequest(context_dir=tmp_path, tag="x:1", target="kernel-a",
                                  build_args={"MAX_JOBS": "2"}, secrets={"ca_bundle": secret})
    classic = engine.BuildClient("/usr/bin/docker", "buildkit", "20.10.24")
    argv = request.argv(classic)
    assert argv[:2] == ["/usr/bin/docker", "build"]
    assert f"id=ca_bundle,src={secret}" in argv
    assert "--build-arg" in argv and "MAX_JOBS=2" in argv
    assert not any("top secret" in a for a in argv)
    buildx = engine.BuildClient("/usr/bin/docker", "buildx", "27.0.0")
    assert request.argv(buildx)[:3] == ["/usr/bin/docker", "buildx", "build"]
    assert "--load" in request.argv(buildx)


def test_a_dropped_connection_is_told_from_an_answer_and_a_timeout():
    """What @reconnecting retries: the socket's error bare or as requests/urllib3 wrap it,
    never a read timeout (wait_container's "still running") nor the engine's answer."""
    import docker
    import requests
    import urllib3

    wrapped = requests.exceptions.ConnectionError(
        urllib3.exceptions.ProtocolError("Connection aborted.", BrokenPipeError(32, "pipe")))
    assert engine._dropped_connection(BrokenPipeError(32, "Broken pipe"))
    assert engine._dropped_connection(wrapped)
    assert engine._dropped_connection(ConnectionResetError(104, "reset"))
    timeout = requests.exceptions.ConnectionError(
        urllib3.exceptions.ReadTimeoutError(None, "/wait", "Read timed out."))
    assert not engine._dropped_connection(timeout)
    assert not engine._dropped_connection(docker.errors.NotFound("no such container"))


def test_split_ref():
    assert engine.split_ref("infermatrix-local/cell:build") == ("infermatrix-local/cell", "build")
    assert engine.split_ref("127.0.0.1:5000/repo") == ("127.0.0.1:5000/repo", "latest")
    assert engine.split_ref("127.0.0.1:5000/repo:t") == ("127.0.0.1:5000/repo", "t")


def test_a_missing_object_is_no_answer_and_another_sdk_error_an_engine_error():
    """inspect, rmi, stop and rm (_translated's missing_ok): the SDK's NotFound is "there is
    none" (None, False, nothing to do); any other SDK error is an EngineError naming the
    command. FAKE SDK clients whose every API call raises: no Docker."""
    import docker
    import pytest

    from infermatrix.errors import EngineError

    class Api:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def __getattr__(self, name: str):
            def call(*args, **kwargs):
                raise self.error
            return call

    def engine_raising(error: Exception) -> engine.Engine:
        made = engine.Engine()
        made._sdk = type("Sdk", (), {"api": Api(error)})()
        return made

    missing = engine_raising(docker.errors.ImageNotFound("no such image"))
    assert missing.inspect_image("x:1") is None and missing.image_id_of("x:1") is None
    assert missing.remove_image("x:1") is False
    missing.stop_container("c0ffee")
    missing.remove_container("c0ffee")
    broken = engine_raising(docker.errors.APIError("the daemon said no"))
    for call, command in ((lambda: broken.inspect_image("x:1"), "docker image inspect x:1"),
                          (lambda: broken.remove_image("x:1"), "docker rmi x:1"),
                          (lambda: broken.stop_container("c0ffee"), "docker stop c0ffee"),
                          (lambda: broken.remove_container("c0ffee"), "docker rm c0ffee")):
        with pytest.raises(EngineError, match=f"^{command}: .*the daemon said no"):
            call()


def test_files_are_read_from_a_created_container_that_is_always_removed(tmp_path):
    """copy_from_image and exported_filesystem: a container created (never started, owned by
    infermatrix), read, and removed afterwards, an error included. FAKE SDK client: no Docker."""
    import io
    import tarfile

    import docker
    import pytest

    class Api:
        def __init__(self) -> None:
            self.created: list[dict] = []
            self.removed: list[str] = []

        def create_container(self, image, command=None, labels=None):
            self.created.append({"image": image, "command": command, "labels": labels})
            return {"Id": "c0ffee" * 8}

        def get_archive(self, container, path):
            if path != "/etc/os-release":
                raise docker.errors.NotFound(f"no {path}")
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                data = b"ID=debian\n"
                info = tarfile.TarInfo("os-release")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            return iter([buffer.getvalue()]), {}

        def export(self, container):
            return iter([b"tar bytes"])

        def remove_container(self, container, force=False, v=False):
            self.removed.append(container)

    api = Api()
    made = engine.Engine()
    made._sdk = type("Sdk", (), {"api": api})()
    copied = made.copy_from_image("x:1", ["/etc/os-release", "/missing"], tmp_path)
    assert copied == {"/etc/os-release": tmp_path / "os-release"}
    assert (tmp_path / "os-release").read_text() == "ID=debian\n"
    with made.exported_filesystem("x:1") as stream:
        assert list(stream) == [b"tar bytes"]
    with pytest.raises(RuntimeError), made.exported_filesystem("x:1"):
        raise RuntimeError("the reader failed")
    assert api.removed == ["c0ffee" * 8] * 3
    assert all(c == {"image": "x:1", "command": ["/bin/true"],
                     "labels": {"io.infermatrix.owner": "infermatrix"}} for c in api.created)


def test_the_data_root_is_read_once_and_only_of_an_engine_on_this_machine(tmp_path,
                                                                            monkeypatch):
    """local_data_root: `docker info`'s DockerRootDir of a unix:// engine, read once; a remote
    engine's is None without asking it. FAKE SDK clients: no Docker."""
    class Sdk:
        asked = 0

        def info(self):
            Sdk.asked += 1
            return {"DockerRootDir": str(tmp_path)}

    monkeypatch.setenv("DOCKER_HOST", "unix:///run/docker.sock")
    here, remote = engine.Engine(), engine.Engine(engine.parse_builder("b=ssh://root@gpu-host"))
    here._sdk = remote._sdk = Sdk()
    assert here.local_data_root() == tmp_path and here.local_data_root() == tmp_path
    assert remote.local_data_root() is None and Sdk.asked == 1


# ---- the real engine ----------------------------------------------------------------------------


def test_docker_host_is_honoured(tmp_path):
    """A DOCKER_HOST pointing nowhere is used (and reported), not silently replaced."""
    import sys

    code = ("from infermatrix.engine import docker as engine\n"
            "try:\n    engine.Engine().sdk()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock",
           "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.startswith("EngineUnavailable") and "nothing.sock" in out and "DOCKER_HOST" in out


def test_only_transports_without_read_timeouts_wait_by_polling(monkeypatch):
    """A timed wait polls the container's state only where the SDK's reads ignore a timeout
    (ssh://, or a context that may stand for it); unix:// and tcp:// use the API's wait."""
    def waits(address: str) -> str:
        builder = engine.Engine(engine.parse_builder(f"b={address}"))
        monkeypatch.setattr(builder, "_wait_by_polling", lambda cid, timeout: "polled")
        monkeypatch.setattr(builder, "_wait_by_api", lambda cid, timeout: "api")
        return builder.wait_container("c0ffee", timeout=5)

    assert waits("ssh://root@gpu-host") == "polled"
    assert waits("some-context") == "polled"
    assert waits("tcp://10.0.0.2:2376") == "api"
    assert waits("unix:///run/docker.sock") == "api"
