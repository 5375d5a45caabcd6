"""Several builders for real (issue 19): the machine's dockerd and a second, private dockerd
(tests/support/dockerd_support.py), reached by tcp:// with TLS as matrix.yaml's build.builders names
it, build one matrix between them; then the second one is killed mid-run. And `report --merge`
over fragments of separate pipeline runs, each started by the exported GitHub workflow's own
command line, equals the report of one run.

The cells are the fault matrix's (tests/support/fault_support.py): tiny real builds on the test
matrix's debootstrap base; the second engine starts empty and the build copies the base to
it (`docker save | docker load`, builders.ensure_bases).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from infermatrix.engine import docker as engine

from tests.support.dockerd_support import PrivateDockerd, wait_for
from tests.support.fault_support import cell_id, remove_images, write_fault_matrix
from tests.support.registry_support import free_port

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOCAL = f"local={os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}"
BIN = Path(sys.executable).parent  # where the `infermatrix` console script is


def infermatrix(*args: str, cwd: Path | None = None, timeout: float = 900
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermatrix", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def records(state: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((state / "journal").glob("*.json"))}


@pytest.fixture(scope="module")
def second_engine(built_base) -> Iterator[PrivateDockerd]:
    if os.geteuid() != 0 or not shutil.which("dockerd") or not shutil.which("containerd"):
        pytest.fail("the several-builders tests need root, dockerd and containerd "
                    "(.ci/provision installs docker.io)")
    second = PrivateDockerd("im19", "172.31.0.1/16", tls_port=free_port())  # unix socket + tcp with --tlsverify
    try:
        second.start()  # empty: the build copies the base to it (builders.ensure_bases)
        assert second.image_id(built_base) is None
        yield second
    finally:
        second.stop()


NAMES = ["alpha", "bravo", "charlie", "delta"]


def write_cells(root: Path, repository: str, second: PrivateDockerd) -> Path:
    """The matrix of 4 tiny cells; each call gives every image a fresh token (nothing of an
    earlier call's builds is in BuildKit's cache). build.builders names the second engine by
    its tcp:// address with TLS files relative to matrix.yaml."""
    matrix = write_fault_matrix(root, {n: {"FAULT_TOKEN": uuid.uuid4().hex, "FAULT_SLEEP": "8"}
                                       for n in NAMES}, repository=repository)
    shutil.copytree(second.certs, root / "certs", dirs_exist_ok=True)
    text = matrix.read_text()
    assert "build:\n" in text
    matrix.write_text(text.replace("build:\n", (
        "build:\n  builders:\n    - name: second\n"
        f"      endpoint: {second.tcp}\n"
        "      tls: {ca: certs/ca.pem, cert: certs/client-cert.pem, key: certs/client-key.pem}\n"
    ), 1))
    return matrix


@pytest.fixture
def cleanup() -> Iterator[tuple[list[str], set[str]]]:
    """(repositories, image ids) a test made on the machine's engine: removed afterwards."""
    repositories: list[str] = []
    made: set[str] = set()
    yield repositories, made
    remove_images(engine.Engine(), [cell_id(n) for n in NAMES], repositories)
    for image in made:
        DOCKER.remove_image(image, force=True)


def new_repository(repositories: list[str]) -> str:
    repositories.append(f"im19-{uuid.uuid4().hex[:8]}")  # tags never move: new images, new repo
    return repositories[-1]


def pipeline(matrix: Path, state: Path, *extra: str) -> list[str]:
    """Both builders: this machine's engine by flag, `second` by name (matrix.yaml's, TLS)."""
    return ["pipeline", "--matrix", str(matrix), "--state-dir", str(state), "--builder", LOCAL,
            "--builder", "second", *extra]


def test_two_engines_build_one_matrix_then_one_dies(second_engine: PrivateDockerd, cleanup,
                                                     tmp_path: Path) -> None:
    repositories, made = cleanup
    matrix = write_cells(tmp_path / "m", new_repository(repositories), second_engine)
    cells = [cell_id(n) for n in NAMES]
    state = tmp_path / "state"
    # 1. Both engines up: the cells are shared out, each engine holds what it built.
    first = infermatrix(*pipeline(matrix, state))
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-4000:]
    built = records(state)
    by_builder = {c: built[c]["builder"]["name"] for c in cells}
    print("first run:", by_builder)
    assert sorted(by_builder.values()) == ["local", "local", "second", "second"]
    for cell in cells:
        record = built[cell]
        assert record["stages"]["build"]["status"] == "pass"
        assert record["stages"]["build"]["details"]["builder"]["name"] == by_builder[cell]
        assert record["stages"]["tag"]["status"] == "pass", record["stages"]["tag"]
        on_second = second_engine.image_id(record["image_id"])
        on_local = DOCKER.image_id_of(record["image_id"])
        if by_builder[cell] == "second":
            assert on_second == record["image_id"] and on_local is None
        else:
            assert on_local == record["image_id"] and on_second is None
    assert f"builder second ({second_engine.tcp}: linux/" in output  # its own figures
    assert "[second] copying base infermatrix/base-bookworm:" in output
    assert "[local] copying base" not in output
    report = json.loads((state / "reports" / "report.json").read_text())
    assert {c["id"]: c["outcome"] for c in report["cells"]} == {c: "tagged" for c in cells}

    assert {built[c]["builder"]["endpoint"] for c in cells} == {LOCAL.split("=", 1)[1],
                                                                 second_engine.tcp}
    # Without the client certificate the TLS engine does not answer: left out, the cell fails
    # naming it (nothing is built, nothing changes on either engine).
    refused = infermatrix("build", "--matrix", str(matrix), "--state-dir",
                          str(tmp_path / "state-nocert"), "--select", cells[0],
                          "--builder", f"nocert={second_engine.tcp}")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "builder nocert left out" in refused.stdout + refused.stderr
    reason = records(tmp_path / "state-nocert")[cells[0]]["stages"]["build"]["reason"]
    assert reason.startswith("no builder for linux/amd64 (builders: none up; nocert is down: "
                             f"{second_engine.tcp} does not answer"), reason

    made.update(r["image_id"] for r in built.values())
    made.update(r["stages"]["tag"]["details"].get("tagged_image_id") or "" for r in
                built.values())
    made.discard("")

    # 2. New images of the same cells, a fresh state; the second engine is SIGKILLed while it
    #    builds its first cell.
    matrix = write_cells(matrix.parent, new_repository(repositories), second_engine)
    state = tmp_path / "state-kill"
    run = subprocess.Popen([sys.executable, "-m", "infermatrix",
                            *pipeline(matrix, state)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def second_is_building() -> bool:
        for cell in cells:
            path = state / "journal" / f"{cell}.json"
            if not path.is_file():
                continue
            record = json.loads(path.read_text())
            log = state / "logs" / cell / "build.log"
            if (record.get("builder") or {}).get("name") == "second" and log.is_file() \
                    and "sleep 8 " in log.read_text():
                return True
        return False

    wait_for(second_is_building, 300, "a cell building on the second engine")
    second_engine.kill()
    out, _ = run.communicate(timeout=600)
    print(out[-3000:])
    assert run.returncode == 1, out[-4000:]
    assert "Traceback" not in out
    after = records(state)
    failed = {c for c in cells if after[c]["stages"]["build"]["status"] == "fail"}
    passed = {c for c in cells if after[c]["stages"]["build"]["status"] == "pass"}
    assert len(failed) == 2 and len(passed) == 2, {c: after[c]["stages"]["build"] for c in cells}
    for cell in failed:
        assert after[cell]["builder"]["name"] == "second"
        assert "builder second" in after[cell]["stages"]["build"]["reason"]
        assert "stopped answering" in after[cell]["stages"]["build"]["reason"]
    assert {after[c]["builder"]["name"] for c in passed} == {"local"}
    report = json.loads((state / "reports" / "report.json").read_text())
    outcomes = {c["id"]: c for c in report["cells"]}
    for cell in failed:
        assert outcomes[cell]["outcome"] == "failed" and outcomes[cell]["failed_stage"] == "build"

    # 3. The rerun, the second engine still dead: it is left out, its cells go to the survivor;
    #    the cells built before are reused, not rebuilt.
    rerun = infermatrix(*pipeline(matrix, state))
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-4000:]
    assert "builder second left out" in output
    final = records(state)
    assert {final[c]["builder"]["name"] for c in cells} == {"local"}
    for cell in cells:
        assert final[cell]["stages"]["tag"]["status"] == "pass"
        assert DOCKER.image_id_of(final[cell]["image_id"]) == final[cell]["image_id"]
    for cell in passed:
        assert final[cell]["image_id"] == after[cell]["image_id"]
    made.update(r["image_id"] for r in final.values())
    assert output.count("unchanged, reused") >= 2
    report = json.loads((state / "reports" / "report.json").read_text())
    assert {c["id"]: c["outcome"] for c in report["cells"]} == {c: "tagged" for c in cells}


# What two runs of the same cells differ in: when and how long, the host's free memory the
# compile plan read when the run started, whether the tag stage found its tag in place.
VOLATILE = ("finished", "duration_s", "updated", "seconds", "compile_plan", "unchanged",
            "phase_s")  # the audit's seconds per phase
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def normalised(report: dict, names: dict[str, str]) -> dict:
    """A report with what differs between two runs of the same cells taken out: times,
    durations, the names in `names` (state directories, matrix folder, repository), and the
    digests, each numbered by where it first appears (a rebuild that missed BuildKit's cache
    is another image id, in the same places)."""
    text = json.dumps(report)
    for name, placeholder in names.items():
        text = text.replace(name, placeholder)
    seen: dict[str, str] = {}
    text = DIGEST.sub(lambda m: seen.setdefault(m.group(0), f"<digest-{len(seen)}>"), text)
    data = json.loads(TIMESTAMP.sub("<time>", text))
    data.pop("generated")

    def scrub(value):
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()
                    if k not in VOLATILE}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value
    return scrub(data)


def differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:150]} != {str(b)[:150]}"]


def test_merged_fragments_of_exported_jobs_equal_one_run(built_base, tmp_path: Path) -> None:
    """Each job of the exported workflow, run here with its own command line, leaves a
    fragment (.state/<cell>); `report --merge` of them equals one pipeline run over the cells."""
    repository, other = (f"im19-{uuid.uuid4().hex[:8]}" for _ in range(2))
    engines = {n: {"FAULT_TOKEN": uuid.uuid4().hex} for n in ["echo", "foxtrot"]}
    matrix = write_fault_matrix(tmp_path / "m", engines, repository=repository)
    # The one run: the same cells from a copy of the matrix tagging into a repository of its
    # own (a tag never moves: the two runs' images must not compete for one tag).
    one_matrix = write_fault_matrix(tmp_path / "one", engines, repository=other)
    cells = [cell_id(n) for n in engines]
    try:
        work = matrix.parent
        workflow = work / "ci.yml"
        exported = infermatrix("export", "github", "--matrix", "matrix.yaml", "--out",
                               str(workflow), cwd=work)
        assert exported.returncode == 0, exported.stderr
        job = yaml.safe_load(workflow.read_text())["jobs"]["cell"]
        listed = [e["cell"] for e in job["strategy"]["matrix"]["include"]]
        assert sorted(listed) == sorted(cells)
        line = next(s["run"] for s in job["steps"] if s.get("name") == "pipeline")
        for cell in listed:  # the job's own shell line, as the runner would run it
            job_run = subprocess.run(["bash", "-c", line], cwd=work, capture_output=True,
                                     text=True, timeout=900,
                                     env={**os.environ, "CELL": cell,
                                          "PATH": f"{BIN}:{os.environ['PATH']}"})
            assert job_run.returncode == 0, job_run.stderr[-3000:]
            assert set(records(work / ".state" / cell)) == {cell}  # its fragment: its cell
        single = tmp_path / "single"
        one_run = infermatrix("pipeline", "--matrix", str(one_matrix), "--state-dir",
                              str(single))
        assert one_run.returncode == 0, one_run.stderr[-3000:]
        merged = tmp_path / "merged"
        merge = infermatrix("report", "--merge", str(work / ".state"), "--matrix", str(matrix),
                            "--out", str(merged))
        assert merge.returncode == 0, merge.stderr[-3000:]
        got = normalised(json.loads((merged / "report.json").read_text()), {
            **{str((work / ".state" / c).resolve()): "<state>" for c in cells},
            str(work.resolve()): "<matrix>", repository: "<repo>"})
        want = normalised(json.loads((single / "reports" / "report.json").read_text()), {
            str(single.resolve()): "<state>", str(one_matrix.parent.resolve()): "<matrix>",
            other: "<repo>"})
        assert [c["id"] for c in got["cells"]] == sorted(cells)
        assert got == want, "\n".join(differences(got, want))
        assert {c["outcome"] for c in got["cells"]} == {"tagged"}
    finally:
        remove_images(engine.Engine(), cells, [repository, other])


def test_smoke_on_a_second_engine_records_its_host_and_the_tag_lands_on_the_tested_id(
        second_engine: PrivateDockerd, cleanup, tmp_path: Path) -> None:
    """`smoke CELL --on second` (issue 30): a cell built on this machine's engine is tested on
    the second one, reached by tcp:// with TLS as build.builders names it: an engine
    elsewhere as far as the tool can tell, so nothing of this machine is bind-mounted into its
    containers (the harness and the audit's tools are copied in). The image goes there by
    docker save | load under its own id; the journal records that engine and its host; the
    tag then lands, on this machine's engine, on the id that was tested there."""
    repositories, made = cleanup
    if second_engine.proc is not None and second_engine.proc.poll() is not None:
        second_engine.start()  # killed by the builders test before this one: up again
    repository = new_repository(repositories)
    matrix = write_cells(tmp_path / "m", repository, second_engine)
    state = tmp_path / "state"
    cell = cell_id("alpha")
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    for step in (["render"], ["build", "--select", cell, "--builder", LOCAL]):
        done = infermatrix(*step, *common)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    image_id = records(state)[cell]["image_id"]
    assert second_engine.image_id(image_id) is None  # built here only

    smoked = infermatrix("smoke", cell, "--on", "second", "--levels", "static", *common)
    assert smoked.returncode == 0, (smoked.stdout + smoked.stderr)[-3000:]
    details = records(state)[cell]["stages"]["smoke"]["details"]
    assert details["levels"]["static"]["status"] == "pass", details["levels"]["static"]
    assert details["engine"] == f"second ({second_engine.tcp})"
    host = details["engine_host"]
    assert host["engine"] == details["engine"] and host["server_version"]
    assert host["platform"] == engine.host_platform() and host["cpus"] >= 1
    assert "cannot give a container a GPU" in host["gpu_access_error"]  # no runtime there
    assert details["image_moved"]["how"] == "docker save | docker load"
    assert second_engine.image_id(image_id) == image_id  # the same id there
    commands = (state / "commands.log").read_text()
    assert re.search(r"docker cp \S+/harness \w{12}:/opt/infermatrix/harness", commands), \
        "the harness was not copied into the remote engine's containers"
    assert not second_engine.docker("ps", "-aq", "--filter",
                                    "label=io.infermatrix.smoke").stdout.strip()

    tagged = infermatrix("tag", cell, "--repository", repository, *common)
    assert tagged.returncode == 0, (tagged.stdout + tagged.stderr)[-3000:]
    assert DOCKER.image_id_of(f"{repository}:{cell}") == image_id
    assert records(state)[cell]["stages"]["tag"]["details"]["image_id"] == image_id

    again = infermatrix("smoke", cell, "--on", "second", "--levels", "static", *common)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert records(state)[cell]["stages"]["smoke"]["details"]["image_moved"]["how"] == \
        "already there"
