"""build.py on the real engine with small hand-written cells (seconds, not minutes).

The cells live in a temporary matrix of fixture engines on the CPU lane, on the test matrix's
debootstrap base: `mini` 1.0 and 2.0 compile the same tiny "kernel" (one cache key), `broken`
fails on purpose, `slow` sleeps (for the timeout and the SIGINT-and-resume checks). The real
rendered cells of tests/matrix/ are built in test_build_matrix.py.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.stages.build import build_cells, local_ref
from infermatrix.context import Context
from infermatrix.stages.plan import plan_matrix
from infermatrix.state import run_lock

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = pytest.mark.docker

MATRIX = """\
version: 1
model: {name: fixture/none, card: "https://example.invalid/card", floors: {}, launch: {}}
python: "3.11"
axes:
  cuda: [cpu]
  torch: ["2.13.0"]
  engine: ["mini==1.0", "mini==2.0", "broken==1.0", "slow==1.0"]
  arch: [cpu]
engines:
  mini: {package: null, platform: cpu, kernels: [minik], serve: ["true"]}
  broken: {package: null, platform: cpu, kernels: [], serve: ["true"]}
  slow: {package: null, platform: cpu, kernels: [], serve: ["true"]}
bases:
  default: bookworm
  definitions:
    bookworm: BASE_DEFINITION
build:
  kernels:
    minik: {package: minik, version: "1.0", gb_per_nvcc_thread: 0.25}
  timeout_minutes: 10
  disk: {min_free_gib: 0}   # never prune the shared engine's cache (other lanes build on it)
"""

MINI = """\
FROM {base} AS toolchain
RUN echo {token} > /token

FROM toolchain AS compile-minik
ARG MAX_JOBS=1
RUN mkdir -p /wheels /tmp/minik/minik && echo "JOBS = $MAX_JOBS" > /tmp/minik/minik/__init__.py \\
 && cd /tmp/minik && python3 -m zipfile -c /wheels/minik-1.0-py3-none-any.whl minik

FROM scratch AS kernel-minik
COPY --from=compile-minik /wheels/ /wheels/

FROM scratch AS kernels-cached
COPY kernel-wheels/ /wheels/

FROM toolchain AS runtime
RUN --mount=type=bind,from=kernels-cached,source=/wheels,target=/tmp/kernel-wheels \\
    ls /tmp/kernel-wheels > /kernel-wheels.txt
LABEL io.infermatrix.cell="{cell}"
"""

BROKEN = """\
FROM {base}
RUN echo "broken-on-purpose: no such header" && exit 3
"""

SLOW = """\
FROM {base}
ARG SLEEP=20
RUN echo {token} && sleep $SLEEP && echo done > /slow
LABEL io.infermatrix.cell="{cell}"
"""


def _cell(ctx: Context, name: str) -> str:
    return next(p.id for p in plan_matrix(ctx) if f"-{name}" in p.id)


@pytest.fixture(scope="module")
def mini_ctx(built_base, test_ctx, tmp_path_factory) -> Context:
    root = tmp_path_factory.mktemp("mini-matrix")
    definition = json.dumps(test_ctx.matrix.bases["definitions"]["bookworm"])
    (root / "matrix.yaml").write_text(MATRIX.replace("BASE_DEFINITION", definition))
    ctx = Context.load(root / "matrix.yaml", root / ".state")
    token = uuid.uuid4().hex  # new layers per test session: nothing comes from an old run
    for plan in plan_matrix(ctx):
        template = {"mini": MINI, "broken": BROKEN, "slow": SLOW}[plan.cell.engine]
        write_cell(ctx, plan.id, template.format(base=built_base, token=token, cell=plan.id))
    yield ctx
    for plan in plan_matrix(ctx):
        DOCKER.remove_image(local_ref(plan.id), force=True)


def write_cell(ctx: Context, cell_id: str, dockerfile: str) -> None:
    """A hand-written cell: its Dockerfile and the committed lock build demands (build refuses
    a cell without one, or rendered from another lock)."""
    lock_file = ctx.root / "locks" / f"{cell_id}.txt"
    lock_file.parent.mkdir(exist_ok=True)
    lock_file.write_text(f"# lock of {cell_id}: a hand-written cell installs nothing\n")
    digest = "sha256:" + hashlib.sha256(lock_file.read_bytes()).hexdigest()
    directory = ctx.images_dir / cell_id
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(dockerfile + f'LABEL io.infermatrix.lock="{digest}"\n')


def _plans(ctx: Context, *names: str):
    return [p for p in plan_matrix(ctx) if p.cell.engine in names]


def _cells(ctx: Context, *names: str):
    """The CellSpecs of `_plans`' planned cells: what build_cells receives."""
    return ctx.specs(_plans(ctx, *names))


def _build_commands(ctx: Context) -> list[str]:
    log = ctx.state.commands_log
    lines = log.read_text().splitlines() if log.is_file() else []
    return [ln for ln in lines if " build " in ln and "--progress=plain" in ln]


def test_first_run_builds_reuses_the_kernel_and_reports_the_failure(mini_ctx):
    from infermatrix.context import setup_command_log

    setup_command_log(mini_ctx.state)
    echoed: list[str] = []
    results = build_cells(mini_ctx, _cells(mini_ctx, "mini", "broken"),
                          RunOptions(), echo=echoed.append, docker=DOCKER)
    mini1, mini2 = _cell(mini_ctx, "mini1.0"), _cell(mini_ctx, "mini2.0")
    broken = _cell(mini_ctx, "broken1.0")
    assert results[mini1].status == results[mini2].status == "pass"
    # The failing cell did not stop the others, and says why with the command and log tail.
    failed = results[broken]
    assert failed.status == "fail" and "exited" in failed.reason
    assert "broken-on-purpose" in failed.log_tail
    assert "build" in failed.command and broken in failed.command
    assert any("broken-on-purpose" in line for line in echoed)
    record = journal.load(mini_ctx.state, broken)
    assert record["stages"]["build"]["status"] == "fail"
    assert "broken-on-purpose" in record["stages"]["build"]["details"]["log_tail"]

    # The kernel is compiled once: the second cell with the same key takes it from the cache.
    kernels = {cell: results[cell].kernels["minik"] for cell in (mini1, mini2)}
    assert sorted(k["cache"] for k in kernels.values()) == ["hit", "miss"]
    assert kernels[mini1]["key"] == kernels[mini2]["key"]
    assert len([c for c in _build_commands(mini_ctx) if "--target kernel-minik" in c]) == 1

    # Images exist under the local reference, with the labels and the kernel wheel inside.
    for cell in (mini1, mini2):
        assert DOCKER.image_id_of(local_ref(cell)) == results[cell].image_id
        labels = DOCKER.image_labels(local_ref(cell))
        assert labels["io.infermatrix.cell"] == cell
        assert labels["io.infermatrix.input-hash"] == journal.load(mini_ctx.state,
                                                                    cell)["input_hash"]
        record = journal.load(mini_ctx.state, cell)
        assert record["image_id"] == results[cell].image_id
        details = record["stages"]["build"]["details"]
        assert details["secret_ids"]
        # the MAX_JOBS the kernel stage received (written into the wheel it compiled) is the
        # one the build recorded: the width the compile gate gave it (issue 47), at least the
        # plan's
        [wheel] = mini_ctx.state.kernels.rglob("minik-1.0-py3-none-any.whl")
        with zipfile.ZipFile(wheel) as archive:
            jobs = archive.read("minik/__init__.py").decode()
        assert jobs.strip() == f"JOBS = {details['kernels']['minik']['max_jobs']}"
        assert details['kernels']['minik']['max_jobs'] >= details['compile_plan']['max_jobs']
        assert Path(record["stages"]["build"]["log"]).is_file()
    out = Path(mini_ctx.state.root) / "copied"
    DOCKER.copy_from_image(local_ref(mini2), ["/kernel-wheels.txt"], out)
    assert (out / "kernel-wheels.txt").read_text().strip() == "minik-1.0-py3-none-any.whl"


def test_rerun_does_no_work(mini_ctx):
    before = len(_build_commands(mini_ctx))
    results = build_cells(mini_ctx, _cells(mini_ctx, "mini"), RunOptions(), echo=lambda _: None,
                          docker=DOCKER)
    assert all(r.status == "pass" and r.reused for r in results.values())
    assert len(_build_commands(mini_ctx)) == before


def test_changed_context_rebuilds_only_that_cell(mini_ctx):
    mini2 = _cell(mini_ctx, "mini2.0")
    extra = mini_ctx.images_dir / mini2 / "notes.txt"
    extra.write_text("a new file in the build context\n")
    try:
        results = build_cells(mini_ctx, _cells(mini_ctx, "mini"), RunOptions(), echo=lambda _: None,
                              docker=DOCKER)
        assert not results[mini2].reused and results[mini2].status == "pass"
        assert results[_cell(mini_ctx, "mini1.0")].reused
    finally:
        extra.unlink()


def test_per_cell_timeout(mini_ctx):
    slow = _cell(mini_ctx, "slow1.0")
    results = build_cells(mini_ctx, _cells(mini_ctx, "slow"),
                          RunOptions(timeout_min=3 / 60), echo=lambda _: None, docker=DOCKER)
    assert results[slow].status == "fail" and results[slow].reason == "timed out"
    assert journal.load(mini_ctx.state, slow)["stages"]["build"]["status"] == "fail"


def test_fail_fast_stops_after_the_first_failure(mini_ctx):
    plans = sorted(_plans(mini_ctx, "broken", "slow"), key=lambda p: p.cell.engine)
    results = build_cells(mini_ctx, mini_ctx.specs(plans), RunOptions(fail_fast=True),
                          echo=lambda _: None, docker=DOCKER)
    assert list(results) == [_cell(mini_ctx, "broken1.0")]


def test_second_run_on_the_same_state_refuses(mini_ctx):
    with run_lock(mini_ctx.state):
        code = subprocess.run(_cli(mini_ctx, "--select", "*mini1.0*"), capture_output=True,
                              text=True, timeout=120)
    assert code.returncode == 2 and "in use" in code.stderr


def test_not_rendered_cell_fails_with_the_fix(mini_ctx, tmp_path):
    ctx = Context.load(mini_ctx.matrix.path, tmp_path / "state")
    ctx_images = ctx.images_dir / "cpu-torch2.13.0-mini1.0-cpu" / "Dockerfile"
    assert ctx_images.is_file()
    plans = _plans(ctx, "mini")
    moved = ctx.images_dir / plans[0].id
    hidden = moved.with_name(moved.name + ".hidden")
    moved.rename(hidden)
    try:
        results = build_cells(ctx, ctx.specs(plans[:1]), RunOptions(), echo=lambda _: None,
                              docker=DOCKER)
    finally:
        hidden.rename(moved)
    assert results[plans[0].id].status == "fail"
    assert "infermatrix render" in results[plans[0].id].reason


def _cli(ctx: Context, *args: str) -> list[str]:
    return [sys.executable, "-m", "infermatrix", "build", "--matrix", str(ctx.matrix.path),
            "--state-dir", str(ctx.state.root), *args]


def fresh_slow_cell(ctx: Context, built_base: str) -> str:
    """The slow cell with new layers (a new token): its build is not in BuildKit's cache."""
    slow = _cell(ctx, "slow1.0")
    dockerfile = ctx.images_dir / slow / "Dockerfile"
    label = dockerfile.read_text().splitlines()[-1]  # the lock label write_cell added
    dockerfile.write_text(SLOW.format(base=built_base, token=uuid.uuid4().hex, cell=slow)
                          + label + "\n")
    return slow


def other_processes_naming(text: str) -> list[str]:
    """Command lines of running processes that contain `text` (a build client left behind)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in line and "pytest" not in line:
            found.append(line)
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_midway_then_rerun_resumes(mini_ctx, built_base, signum):
    """SIGINT (Ctrl-C) and SIGTERM (CI cancelling, `timeout`, `docker stop`) take one path:
    the `docker build` client is signalled and gone, the state's tmp/ and the run lock are
    clean, exit 128 + the signal with the line that says to rerun; the rerun resumes."""
    mini1, slow = _cell(mini_ctx, "mini1.0"), fresh_slow_cell(mini_ctx, built_base)
    args = ("--select", "*mini1.0*", "--select", "*slow1.0*")
    first = subprocess.Popen(_cli(mini_ctx, *args), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    # Wait until the slow cell's build is under way (its record says `running`).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if journal.cell_record(mini_ctx.state, slow).status_of("build") == "running" \
                and first.poll() is None:
            break
        time.sleep(0.2)
    else:
        first.kill()
        pytest.fail(f"the slow cell never started: {first.communicate()[0]}")
    time.sleep(2)
    first.send_signal(signum)
    output, _ = first.communicate(timeout=60)
    assert first.returncode == 128 + signum, output
    assert f"interrupted ({signal.Signals(signum).name}); finished cells are kept, rerun to " \
        "resume" in output
    assert not other_processes_naming(f"/context-{slow}-"), "a build client was left running"
    assert not any((mini_ctx.state.root / "tmp").glob(f"context-{slow}-*"))
    assert (mini_ctx.state.root / "run.lock").read_text() == ""  # no dead pid in it
    assert journal.cell_record(mini_ctx.state, slow).status_of("build") == "running"
    assert journal.cell_record(mini_ctx.state, mini1).status_of("build") == "pass"
    # Every record is whole JSON (atomic writes), and no temporary file is left behind.
    for path in mini_ctx.state.journal.glob("*"):
        assert path.suffix == ".json", path
        json.loads(path.read_text())

    second = subprocess.run(_cli(mini_ctx, *args), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    said = second.stdout + second.stderr  # the build step's lines (on stderr, as the main job's)
    assert f"{mini1}: pass (unchanged, reused)" in said
    assert f"{slow}: pass (built" in said
    assert DOCKER.image_exists(local_ref(slow))


def test_parallel_cells_share_one_kernel_compile(mini_ctx, tmp_path):
    ctx = Context.load(mini_ctx.matrix.path, tmp_path / "state")
    ctx.matrix.data.setdefault("build", {})["max_parallel_cells"] = 2
    echoed: list[str] = []
    results = build_cells(ctx, _cells(ctx, "mini"), RunOptions(), echo=echoed.append, docker=DOCKER)
    assert "2 cell(s) compiling at once" in echoed[0]
    assert all(r.status == "pass" and not r.reused for r in results.values())
    caches = sorted(r.kernels["minik"]["cache"] for r in results.values())
    assert caches == ["hit", "miss"]  # the second waited for the first's wheel


def test_second_run_with_wait_runs_after_the_first(mini_ctx):
    import threading

    released = threading.Event()

    def hold() -> None:
        with run_lock(mini_ctx.state):
            released.wait(3)

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.5)
    started = time.monotonic()
    threading.Timer(2, released.set).start()
    results = build_cells(mini_ctx, _cells(mini_ctx, "mini"),
                          RunOptions(wait=True), echo=lambda _: None, docker=DOCKER)
    holder.join()
    assert time.monotonic() - started >= 1.5  # it waited for the holder
    assert all(r.status == "pass" for r in results.values())
