"""Several builders, pure logic (issue 19): `--builder` parsing, build.builders in matrix.yaml
(schema errors with file and line), and who builds which cell (platform, capacity, the
builder of the last build). No Docker: a builder's figures are given as `docker info` would
report them. The real two-engine test is tests/docker/test_builders_docker.py."""

from __future__ import annotations

from tests.paths import TESTS

from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix.config import load_matrix
from infermatrix.engine.docker import Endpoint, Engine, DockerFacts, parse_builder
from infermatrix.errors import ConfigError, UsageError
from infermatrix.model.cell import Cell, CellPlan
from infermatrix.model.spec import CellSpec, machine_of
from infermatrix.engine import builders
from infermatrix.stages.plan import settings_for

TESTS = TESTS
GIB = 2**30


def test_builder_flags_name_endpoints_or_contexts() -> None:
    assert parse_builder("unix:///run/x.sock") == Endpoint("builder1", host="unix:///run/x.sock")
    assert parse_builder("arm=ssh://me@gb10", 1) == Endpoint("arm", host="ssh://me@gb10")
    assert parse_builder("tcp://10.0.0.5:2376", 2).name == "builder3"
    assert parse_builder("desk") == Endpoint("desk", context="desk")
    assert parse_builder("x=desk").context == "desk"
    ssh = parse_builder("ssh://me@gb10")
    assert ssh.cli_env() == {"DOCKER_HOST": "ssh://me@gb10"}
    assert parse_builder("desk").cli_env() == {"DOCKER_CONTEXT": "desk"}
    for bad in ("http://host:2375", "=unix:///x", "bad name=unix:///x", ""):
        with pytest.raises(UsageError):
            parse_builder(bad)


def write_matrix(tmp_path: Path, builders_yaml: str) -> Path:
    text = (TESTS / "matrix" / "matrix.yaml").read_text()
    marker = "build:\n"
    assert marker in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(marker, marker + builders_yaml, 1))
    (tmp_path / "fixtures").symlink_to(TESTS / "fixtures")
    return path


def test_build_builders_with_tls_files_relative_to_the_matrix(tmp_path) -> None:
    matrix = load_matrix(write_matrix(tmp_path, (
        "  builders:\n"
        "    - {name: here, endpoint: 'unix:///var/run/docker.sock'}\n"
        "    - name: arm\n"
        "      endpoint: tcp://arm-host:2376\n"
        "      tls: {ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}\n"
        "      platforms: [linux/arm64]\n"
        "    - {name: desk, context: desk}\n")))
    here, arm, desk = builders.endpoints_of_matrix(matrix)
    assert here.host == "unix:///var/run/docker.sock" and desk.context == "desk"
    assert arm.tls_cert == str(tmp_path / "certs" / "cert.pem")
    assert arm.platforms == ("linux/arm64",)
    assert arm.cli_env() == {"DOCKER_HOST": "tcp://arm-host:2376"}
    certs = tmp_path / "certs"
    assert Engine(arm).cli("docker", ["build", "."]) == [
        "docker", "--tlsverify", "--tlscacert", str(certs / "ca.pem"), "--tlscert",
        str(certs / "cert.pem"), "--tlskey", str(certs / "key.pem"), "build", "."]
    assert Engine(here).cli("docker", ["load"]) == ["docker", "load"]
    # --builder replaces the list; a flag naming a configured builder takes its settings.
    chosen = builders.endpoints_for(matrix, ["arm", "other=unix:///run/o.sock"])
    assert [e.name for e in chosen] == ["arm", "other"] and chosen[0].tls_cert
    with pytest.raises(UsageError, match="share a name"):
        builders.endpoints_for(matrix, ["unix:///a", "builder1=unix:///b"])


@pytest.mark.parametrize("entry, problem", [
    ("    - {name: x, endpoint: 'http://h:2375'}\n", "'http://h:2375' is not a valid value"),
    ("    - {name: x}\n", "'endpoint' is required here"),
    ("    - {name: x, endpoint: 'tcp://h:2376', tls: {ca: a.pem}}\n", "'cert' is required"),
    ("    - {name: x, endpoint: 'unix:///s', platforms: [arm64]}\n", "'arm64' is not a valid"),
])
def test_a_bad_builder_entry_is_a_config_error_with_its_line(tmp_path, entry, problem) -> None:
    path = write_matrix(tmp_path, "  builders:\n" + entry)
    with pytest.raises(ConfigError) as caught:
        load_matrix(path)
    line = path.read_text().splitlines().index(entry.rstrip("\n")) + 1
    assert problem in str(caught.value) and f"{path}:{line}:" in str(caught.value)


def builder(name: str, platform: str, cpus: int, memory_gib: float,
            platforms: tuple[str, ...] = ()) -> builders.Builder:
    endpoint = Endpoint(name, host=f"unix:///run/{name}.sock", platforms=platforms)
    return builders.Builder(endpoint, Engine(endpoint),
                            DockerFacts(cpus, int(memory_gib * GIB), platform))


def spec(arch: str, engine_version: str, platform: str) -> CellSpec:
    """A planned cell's CellSpec for `platform` (what builders.assign reads); no lock."""
    matrix = load_matrix(TESTS / "matrix" / "matrix.yaml")
    cell = Cell(cuda="13.0", torch="2.13.0", engine="kernel-fixture",
                engine_version=engine_version, arch=arch)
    settings = settings_for(cell, matrix, None, "flashinfer")
    settings.platform = platform
    return CellSpec(CellPlan(cell, "planned", settings=settings), platform, machine_of(platform),
                    settings.python, settings.base, (settings.base,), settings.engine_package,
                    (), Path("/nonexistent/uv.lock"))


def test_cells_go_by_platform_then_by_queue_per_cpu() -> None:
    big = builder("big", "linux/amd64", 16, 64)
    small = builder("small", "linux/amd64", 4, 16)
    arm = builder("gb10", "linux/arm64", 20, 128)
    amd64 = [spec("sm_120", f"1.{i}", "linux/amd64") for i in range(10)]
    arm64 = [spec("sm_121", f"1.{i}", "linux/arm64") for i in range(2)]
    refused = builders.assign(amd64 + arm64, [big, small, arm], {}, {})
    assert refused == {}
    assert [p.id for p in arm.queue] == [p.id for p in arm64]  # only the Arm engine fits
    assert (len(big.queue), len(small.queue)) == (8, 2)  # 16 CPUs : 4 CPUs


def test_a_declared_platform_and_the_last_builder_of_a_cell_are_kept() -> None:
    emulating = builder("qemu", "linux/amd64", 2, 8, platforms=("linux/amd64", "linux/arm64"))
    other = builder("other", "linux/amd64", 64, 256)
    cells = [spec("sm_121", "1.0", "linux/arm64"), spec("sm_120", "1.0", "linux/amd64")]
    refused = builders.assign(cells, [emulating, other], {cells[1].id: "qemu"}, {})
    assert refused == {}
    assert [p.id for p in emulating.queue] == [cells[0].id, cells[1].id]  # sticky despite load
    assert other.queue == []


def test_no_builder_for_a_platform_says_which_are_there_and_which_are_down() -> None:
    amd = builder("amd", "linux/amd64", 2, 8)
    cell = spec("sm_121", "1.0", "linux/arm64")
    refused = builders.assign([cell], [amd], {}, {"gb10": "ssh://gb10 does not answer"})
    assert refused[cell.id].startswith("no builder for linux/arm64 (builders: amd linux/amd64; "
                                       "gb10 is down: ssh://gb10 does not answer)")


def test_each_builder_plans_its_compile_from_its_own_figures(tmp_path) -> None:
    from infermatrix.context import Context
    from infermatrix.stages.build import compile_plan_for

    ctx = Context.load(TESTS / "matrix" / "matrix.yaml", tmp_path / "state")
    small, big = builder("small", "linux/amd64", 2, 8), builder("big", "linux/amd64", 32, 256)
    plans = {b.name: compile_plan_for(ctx, [["cudakern"]], RunOptions(), builder=b)
             for b in (small, big)}
    assert (plans["small"].max_jobs, plans["big"].max_jobs) == (2, 32)  # CPUs bound both
    assert plans["big"].as_dict()["memory_gb"] == 256.0
    assert "(builder big: docker info MemTotal), 32 CPU(s)" in plans["big"].describe()


def test_base_refs_are_the_images_built_from_not_the_stages() -> None:
    text = ("FROM infermatrix/base-bookworm:b-1 AS toolchain\nRUN x\n"
            "FROM toolchain AS compile-k\nFROM scratch AS kernel-k\n"
            "FROM --platform=linux/arm64 nvidia/cuda:13.0-devel AS other\n"
            "FROM toolchain AS runtime\nCOPY --from=kernel-k / /\n")
    assert builders.base_refs(text) == ["infermatrix/base-bookworm:b-1",
                                        "nvidia/cuda:13.0-devel"]


MALFORMED = ["ssh://", "ssh://user@", "ssh://h:abc", "ssh://h:0", "ssh://h/path", "tcp://",
             "tcp://host:notaport", "tcp://host:99999", "tcp://:2375", "tcp://h:2375/x?y=1",
             "unix://", "unix://relative.sock", "a b", "x=tcp://h 1:2375"]


@pytest.mark.parametrize("bad", MALFORMED)
def test_a_malformed_builder_is_a_usage_error_naming_the_flag(tmp_path, capsys, bad) -> None:
    """Issue 48: these were taken, then the builder "did not answer" (exit 1) or the engine was
    unreachable (exit 4, "start dockerd"). The flag's value is wrong: exit 2, before anything
    runs, naming --builder and what is wrong."""
    from infermatrix.cli import main

    code = main(["build", "--matrix", str(TESTS / "matrix" / "matrix.yaml"), "--state-dir",
                 str(tmp_path / "state"), "--select", "cpu-*", "--builder", bad])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--builder {bad!r}" in err and "start dockerd" not in err, err
    assert not (tmp_path / "state" / "journal").exists() or \
        not list((tmp_path / "state" / "journal").iterdir())


@pytest.mark.parametrize("bad", MALFORMED)
def test_a_malformed_smoke_engine_is_a_usage_error_naming_the_flag(tmp_path, capsys, bad):
    from infermatrix.cli import main

    code = main(["smoke", "--matrix", str(TESTS / "matrix" / "matrix.yaml"), "--state-dir",
                 str(tmp_path / "state"), "--on", bad])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--smoke-on {bad!r}" in err and "no cell to test" not in err, err


@pytest.mark.parametrize("good", ["ssh://me@gb10", "ssh://me@gb10:2222", "ssh://gb10.lan",
                                  "ssh://me@[fd00::5]:22", "tcp://10.0.0.5:2376", "tcp://dock",
                                  "tcp://[fd00::5]:2376", "unix:///run/x.sock", "desk",
                                  "my-ctx.2", "arm=ssh://me@gb10"])
def test_well_formed_endpoints_still_parse(good) -> None:
    assert parse_builder(good).address
