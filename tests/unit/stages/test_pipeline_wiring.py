"""The pipeline's wiring, fast: every step of `stages.STEPS` over cells of the test matrix,
with the real plan, lock, render, build, audit, smoke, tag and report code and a FAKE engine
(tests/support/recording_engine.py, a recording engine: no Docker). What it proves is the wiring —
step order, the journal's stage names, which cells drop out where, what reaches the engine.
tests/docker/test_pipeline.py runs the same job for real, end to end on Docker.
"""

from __future__ import annotations

from tests.paths import TESTS

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from infermatrix.engine import docker as engine
from infermatrix import journal, stages
from infermatrix.stages import lock
from infermatrix.stages.audit import MARKER, expected_pins
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.options import RunOptions, resolve
from infermatrix.pipeline import run_pipeline
from infermatrix.stages import Run, StepStatus, plan_cells

from tests.support.planning_support import recorded_metadata
from tests.support.recording_engine import RecordingEngine, result_line

TESTS = TESTS
CPU = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
GPU = "cu130-torch2.13.0-kernel-fixture1.0-sm120"  # its audit probe fails (scripted)
BROKEN = "cu130-torch2.13.0-broken-fixture1.0-sm120"  # its build fails (scripted)
LOCK_PRUNED = "cu130-torch2.13.0-kernel-fixture2.0-sm120"  # the last lock found no solution
SELECTED = [CPU, GPU, BROKEN, LOCK_PRUNED]


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    """The test matrix and its locks in a temp dir (render writes images/ beside them)."""
    shutil.copytree(TESTS / "matrix", tmp_path / "matrix",
                    ignore=shutil.ignore_patterns("images"))  # what another run rendered
    (tmp_path / "fixtures").symlink_to(TESTS / "fixtures")  # kernel `path: ../fixtures/...`
    return Context.load(tmp_path / "matrix" / "matrix.yaml", tmp_path / "state")


def unsatisfiable(ctx: Context, cell_id: str) -> None:
    lock.record(ctx, lock.LockResult(cell_id, "unsatisfiable", explanation="no solution: x"))


def probe_facts(ctx: Context, plan) -> str:
    """What the audit probe prints for an image that has exactly the cell's pins."""
    facts = {"python": "3.11.2", "site_dirs": ["/opt/venv/lib/python3.11/site-packages"],
             "distributions": {name: version
                               for name, (version, _) in expected_pins(ctx.spec(plan)).items()},
             "objects": [], "torch": {"version": "2.13.0+cpu", "cuda": None},
             "pip_check": {"tool": "uv", "command": "uv pip check", "returncode": 0,
                           "output": ""}}
    return MARKER + json.dumps(facts)


def scripted(ctx: Context, plans_by_id: dict, fake: RecordingEngine):
    def script(image: str, entrypoint: list[str], command: list[str]) -> tuple[int, str]:
        cell_id = fake.images[image]["Config"]["Labels"]["io.infermatrix.cell"]
        if entrypoint == ["python3"] and command[:2] == ["-m", "harness.audit_probe"]:
            if cell_id == GPU:
                return 1, "Traceback: the probe exploded"
            return 0, probe_facts(ctx, plans_by_id[cell_id])
        if entrypoint[-1:] == ["harness.static_check"]:
            return 0, result_line(status="pass", reason=None, check="static")
        raise AssertionError(f"unexpected container {entrypoint} {command}")
    return script


def run_wired(ctx: Context) -> tuple[RecordingEngine, int, list, Run]:
    unsatisfiable(ctx, LOCK_PRUNED)
    plans = plan_cells(ctx, SELECTED, source=recorded_metadata)
    fake = RecordingEngine(fail_builds={BROKEN})
    fake.script = scripted(ctx, {p.id: p for p in plans}, fake)
    base_refs = []
    for name in ("bookworm",):
        from infermatrix.stages.base import image_ref
        base_refs.append(image_ref(ctx.matrix, name, "linux/amd64"))
    fake.present.update(base_refs)
    run = Run(ctx, plans, RunOptions(levels=["static"], publish=False), SELECTED, [],
              docker=fake)  # every step gets the recording engine by hand
    code, records = run_pipeline(run)
    return fake, code, records, run


def test_every_step_runs_in_order_and_cells_drop_out_where_they_fail(ctx):
    fake, code, records, _ = run_wired(ctx)
    assert [r.name for r in records] == list(journal.STAGES) == list(stages.STEP_NAMES)
    by_step = {r.name: r for r in records}
    assert by_step["plan"].dropped == [LOCK_PRUNED]
    assert BROKEN in by_step["build"].failed
    assert by_step["audit"].failed == [GPU] and by_step["audit"].passed == [CPU]
    assert by_step["smoke"].passed == [CPU]  # neither the broken build nor the failed audit
    assert by_step["publish"].status is StepStatus.NOT_CONFIGURED
    assert code == 1  # a cell failed
    records_on_disk = journal.load_records(ctx.state)
    assert records_on_disk[BROKEN].status_of("build") == journal.Status.FAIL
    assert records_on_disk[BROKEN].stage("audit") is None
    assert records_on_disk[GPU].status_of("audit") == journal.Status.FAIL
    assert records_on_disk[GPU].stage("smoke") is None
    assert records_on_disk[CPU].status_of("smoke") == journal.Status.PASS
    run_json = json.loads((ctx.state.root / "run.json").read_text())
    assert [s["name"] for s in run_json["steps"]] == list(journal.STAGES)


def test_what_reaches_the_engine(ctx):
    fake, _, _, _ = run_wired(ctx)
    builds = fake.named("build_image")
    kernel = [b for b in builds if b.args["target"] == "kernel-cudakern"]
    assert kernel and kernel[0].args["output_dir"] is not None
    assert {b.args["tag"].split("/")[-1].split(":")[0] for b in builds if b.args["tag"]} \
        == {CPU, GPU, BROKEN}
    assert all(b.args["platform"] is None for b in builds)  # amd64 cells on an amd64 engine
    assert all(b.args["build_args"]["MAX_JOBS"].isdigit() for b in builds)
    # The audit step probes each built image once; smoke's static level reuses that record.
    probes = [c for c in fake.named("run_container") if c.args["entrypoint"] == ["python3"]]
    assert len(probes) == 2 and all(c.args["network"] == "none" for c in probes)
    static = journal.load(ctx.state, CPU)["stages"]["smoke"]["details"]["levels"]["static"]
    assert static["audit"]["reused"].startswith("audit stage of")
    # Every container the stages started was removed.
    names = [c.args["name"] for c in fake.named("run_container")]
    assert len(set(names)) == len(names) == 3 and all(names)
    removed = {c.args["container"] for c in fake.named("remove_container")}
    assert removed == set(fake._containers)


def test_the_report_step_shows_cells_the_lock_pruned(ctx):
    run_wired(ctx)
    report = json.loads((ctx.state.reports / "report.json").read_text())
    cells = {c["id"]: c for c in report["cells"]}
    assert cells[LOCK_PRUNED]["outcome"] == "pruned"
    assert cells[LOCK_PRUNED]["reasons"][0]["rule"] == lock.UNSATISFIABLE_RULE
    assert cells[BROKEN]["label"] == "failed at build"
    assert cells[GPU]["label"] == "failed at audit"


def test_publish_of_no_cell_publishes_nothing(ctx, monkeypatch):
    """An empty cell list is not a selection of every cell (Selection([]) matches all)."""
    from infermatrix.stages import publish

    monkeypatch.setattr(publish, "registry_configured", lambda *given: True)
    monkeypatch.setattr(publish, "publish", lambda *a, **k: pytest.fail("publish was called"))
    run = Run(ctx, [], RunOptions())
    record = publish.step(run, [])
    assert record.status is StepStatus.NOTHING_TO_DO and not record.passed


def test_verify_repro_builds_for_the_cells_platform(ctx):
    from infermatrix.stages import build
    from infermatrix.reproducibility import repro

    (plan,) = plan_cells(ctx, [CPU], source=recorded_metadata)
    arm = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings,
                                                                 platform="linux/arm64"))
    directory = build.cell_dir(ctx, CPU)
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text("FROM scratch\n")
    fake = RecordingEngine()
    repro.build_twice(ctx, ctx.spec(arm), ctx.state.root / "repro.log", build_args={}, secrets={},
                      docker=fake)
    platforms = [c.args["platform"] for c in fake.named("build_image")]
    wanted = None if engine.host_platform() == "linux/arm64" else "linux/arm64"
    assert platforms == [wanted, wanted]


# -- run options: declared once, validated the same in every command ---------------------------

@pytest.mark.parametrize("command", ["pipeline", "build"])
@pytest.mark.parametrize("value", ["-3", "0", "x"])
def test_max_jobs_must_be_a_positive_int_in_every_command(command, value, tmp_path, capsys):
    state = tmp_path / "state"
    code = main([command, "--matrix", str(TESTS / "matrix" / "matrix.yaml"), "--state-dir",
                 str(state), "--max-jobs", value])
    assert code == 2
    assert "--max-jobs" in capsys.readouterr().err
    assert not state.exists()  # a usage error writes nothing


def test_options_come_from_flag_then_env_then_matrix_then_default():
    import argparse

    matrix = {"build": {"timeout_minutes": 30}, "smoke": {"levels": ["static", "gpu"]}}
    args = argparse.Namespace(max_jobs="2", timeout_min=None, levels=None, nvcc_threads=None,
                              ca_bundle=None, fail_fast=False, wait=True, force=False)
    options = resolve(args, matrix, env={"INFERMATRIX_NVCC_THREADS": "3"})
    assert (options.max_jobs, options.nvcc_threads, options.timeout_min, options.levels) == \
        (2, 3, 30.0, ["static", "gpu"])
    assert options.sources == {"max_jobs": "--max-jobs", "nvcc_threads": "INFERMATRIX_NVCC_THREADS",
                               "timeout_min": "build.timeout_minutes", "levels": "smoke.levels",
                               "wait": "--wait"}
    assert "max_jobs=2 (--max-jobs)" in options.preamble()
    assert resolve(None, {}, env={}).timeout_min == 180.0
    with pytest.raises(Exception, match="INFERMATRIX_MAX_JOBS"):
        resolve(None, {}, env={"INFERMATRIX_MAX_JOBS": "0"})


# -- disk: a build is not started without the space it needs --------------------------------

@pytest.mark.parametrize("prune", [True, False])
def test_a_cell_short_of_disk_is_refused_before_its_build_after_pruning_when_allowed(
        ctx, tmp_path, prune):
    from infermatrix.stages import build, render

    ctx.matrix.build["disk"] = {"min_free_gib": 10**9, "prune_when_low": prune}  # never there
    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    render.render_cells(ctx, plans)
    fake = RecordingEngine(data_root=tmp_path)
    result = build.build_cells(ctx, ctx.specs(plans), RunOptions(), echo=lambda _: None,
                               docker=fake)[CPU]
    assert result.status == "fail"
    assert result.reason.startswith("not started: ") and "build.disk.min_free_gib" in result.reason
    assert str(tmp_path) in result.reason
    assert fake.named("build_image") == []  # nothing started, so nothing to lose
    assert len(fake.named("prune_build_cache")) == (1 if prune else 0)
    assert journal.load(ctx.state, CPU)["stages"]["build"]["status"] == "fail"


def test_a_short_disk_prunes_the_least_recently_used_cache_first_then_all(ctx, tmp_path):
    """The guard first asks BuildKit to keep all but what the cell lacks (--keep-storage:
    the newest records, the uv cache mount, stay), and prunes everything only when that was
    not enough."""
    from infermatrix.stages import build, render

    ctx.matrix.build["disk"] = {"min_free_gib": 10**9}  # never there
    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    render.render_cells(ctx, plans)
    fake = RecordingEngine(data_root=tmp_path, cache_bytes=2 * 10**9 * 2**30)
    result = build.build_cells(ctx, ctx.specs(plans), RunOptions(), echo=lambda _: None,
                               docker=fake)[CPU]
    assert result.status == "fail"
    first, last = [c.args["keep_bytes"] for c in fake.named("prune_build_cache")]
    assert first is not None and 0 < first < fake.cache_bytes and last is None
    log = ctx.state.cell_log(CPU, "build").read_text()
    assert "--keep-storage" in log and "docker builder prune --all --force" in log


@pytest.mark.parametrize(("cache_gib", "free", "need", "keep_gib"), [
    (30, 27.6, 40, 30 - 13.4),   # the GB10 cell after an sm_120 one: 13.4 GiB of the oldest go
    (10, 27.6, 40, None),        # the cache holds less than the cell lacks: all of it goes
    (0, 5, 10, None),
])
def test_the_lru_prune_keeps_all_but_what_the_cell_lacks(cache_gib, free, need, keep_gib):
    from infermatrix.stages.build import GIB, lru_keep_bytes

    keep = lru_keep_bytes(int(cache_gib * GIB), free, need)
    assert keep == (None if keep_gib is None else pytest.approx(keep_gib * GIB, abs=GIB / 100))


DANGLING = ("failed to get usage for 4j2k9x0q7l1m: snapshot 9f8e7d6c5b4a not found")


@dataclasses.dataclass(eq=False)
class FAKEDanglingCacheEngine(RecordingEngine):
    """FAKE: an engine whose build cache holds a dangling record, as an engine stopped
    mid-build can leave it: `docker system df` answers 500 "failed to get usage ... snapshot
    ... not found" (a real engine cannot easily be made to show it). The answer is the SDK's
    own APIError for a 500, read by Engine.build_cache_bytes's real code. Its prune frees
    what `filler` holds on the data root (a real file on a real tmpfs: statvfs sees it)."""

    filler: Path | None = None

    def sdk(self):  # type: ignore[no-untyped-def]
        import docker
        import requests

        class Api:
            @staticmethod
            def df():
                response = requests.Response()
                response.status_code = 500
                response.url = "http+docker://localhost/v1.41/system/df"
                raise docker.errors.APIError("500 Server Error", response=response,
                                             explanation=DANGLING)

        return Api()

    def build_cache_bytes(self) -> int:
        return engine.Engine.build_cache_bytes(self)

    def prune_build_cache(self, log_path=None, keep_bytes=None) -> None:  # type: ignore
        super().prune_build_cache(log_path, keep_bytes)
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)


@pytest.fixture
def shm_root():
    """A folder on /dev/shm (a tmpfs: nothing else writes there while the test measures)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="im48-root-", dir="/dev/shm"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("freed", [True, False], ids=["prune-frees-enough", "disk-really-full"])
def test_a_500_from_docker_system_df_does_not_stop_the_disk_guard(ctx, shm_root, freed):
    """Issue 48: `docker system df` answering 500 (a dangling build-cache record) made every
    build fail at the disk guard. The guard measures the data root's filesystem (statvfs),
    says what it found and names the fix, prunes without the cache's size, and the build
    goes on when there is room (and is refused as any short disk is when there is not)."""
    from infermatrix.stages import build, render

    filler = shm_root / "cache-layers"
    with filler.open("wb") as handle:
        handle.write(b"\0" * (256 * 2**20))
    free = build.free_gib(shm_root)
    need = free + (128 if freed else 4096) / 1024  # the filler's 256 MiB cover 128, not 4096
    ctx.matrix.build["disk"] = {"min_free_gib": need}
    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    render.render_cells(ctx, plans)
    fake = FAKEDanglingCacheEngine(data_root=shm_root, filler=filler)
    said: list[str] = []
    result = build.build_cells(ctx, ctx.specs(plans), RunOptions(), echo=said.append,
                               docker=fake)[CPU]
    log = ctx.state.cell_log(CPU, "build").read_text()
    assert "docker system df" in log and DANGLING in log, log
    assert f"free under {shm_root} (statvfs of the data root's filesystem)" in log
    assert "restart the Docker engine" in log and "buildkit" in log  # the fix, named
    assert any("docker system df" in line and "500" in line for line in said), said
    assert [c.args["keep_bytes"] for c in fake.named("prune_build_cache")] == [None]
    if freed:
        assert result.status == "pass", result.summary()
        assert fake.named("build_image")
    else:
        assert result.status == "fail" and result.reason.startswith("not started: ")
        assert "build.disk.min_free_gib" in result.reason and DANGLING in result.reason
        assert fake.named("build_image") == []


def test_a_cell_with_enough_free_space_builds_without_a_prune(ctx, tmp_path):
    from infermatrix.stages import build, render

    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    render.render_cells(ctx, plans)
    ctx.matrix.build["disk"] = {"min_free_gib": 0.001}
    fake = RecordingEngine(data_root=tmp_path)
    result = build.build_cells(ctx, ctx.specs(plans), RunOptions(), echo=lambda _: None,
                               docker=fake)[CPU]
    assert result.status == "pass", result.summary()
    assert fake.named("prune_build_cache") == [] and fake.named("build_image")


def test_a_cell_that_fails_at_tag_fails_the_pipeline(ctx):
    """Its tag already names another image: the summary's "failed at tag" is exit 1 (issue 32),
    and publish, with nothing to publish because of it, fails too."""
    from infermatrix.stages import publish
    from infermatrix.stages.base import image_ref
    from infermatrix.stages.tagging import tag_ref

    ctx.matrix.data["tag_policy"]["require"] = ["static"]
    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    fake = RecordingEngine()
    fake.script = scripted(ctx, {p.id: p for p in plans}, fake)
    other = "sha256:" + "9" * 64
    fake.images[other] = {"Id": other, "Config": {"Labels": {}}}
    cpu_plan = next(p for p in plans if p.id == CPU)
    fake.tags[tag_ref(ctx, cpu_plan.cell)] = other
    fake.present.add(image_ref(ctx.matrix, "bookworm", "linux/amd64"))
    run = Run(ctx, plans, RunOptions(levels=["static"], publish=False), [CPU], [],
              docker=fake)
    code, records = run_pipeline(run)
    by_step = {r.name: r for r in records}
    assert by_step["smoke"].passed == [CPU] and by_step["tag"].failed == [CPU]
    assert code == 1
    ctx.matrix.data["publish"]["registry"] = "127.0.0.1:9/never-reached"
    result = publish.publish(Run(ctx, [], RunOptions(), docker=fake), say=lambda line: None)
    assert not result.pushed and CPU in result.failed and not result.ok


def test_a_tagged_cell_the_run_does_not_plan_is_not_published(ctx):
    """images.lock's serve command comes from the run's CellSpec, never from re-planning the
    image's labels: a tagged cell the run does not plan fails publish, with the fix, before
    anything reaches the registry."""
    from infermatrix.stages import publish
    from infermatrix.stages.base import image_ref

    ctx.matrix.data["tag_policy"]["require"] = ["static"]
    plans = plan_cells(ctx, [CPU], source=recorded_metadata)
    fake = RecordingEngine()
    fake.script = scripted(ctx, {p.id: p for p in plans}, fake)
    fake.present.add(image_ref(ctx.matrix, "bookworm", "linux/amd64"))
    run = Run(ctx, plans, RunOptions(levels=["static"], publish=False), [CPU], [],
              docker=fake)
    code, records = run_pipeline(run)
    assert code == 0 and {r.name: r for r in records}["tag"].passed == [CPU]
    from infermatrix.model.selectors import Selection
    from tests.unit.consumer.test_deploy import labels

    [tagged] = publish.tagged_cells(ctx.state, Selection())
    cpu_cell = next(p.cell for p in plans if p.id == CPU)
    fake.images[tagged.image_id].setdefault("Config", {})["Labels"] = labels(cpu_cell)
    ctx.matrix.data["publish"]["registry"] = "127.0.0.1:9/never-reached"
    result = publish.publish(Run(ctx, [], RunOptions(), docker=fake), say=lambda line: None,
                             cells=[])
    assert not result.pushed and not result.ok
    assert "is tagged but not planned" in result.failed[CPU]
    assert "fix: publish with the matrix.yaml the image was built from" in result.failed[CPU]
    assert not fake.named("push_image")


def test_the_option_table_is_the_dataclass_and_every_flag_parses_through_it():
    """One declaration per option: each RunOptions field (but `sources`) has its row, and a
    parser built from the rows gives back each flag's value through `resolve`."""
    import argparse
    import dataclasses

    from infermatrix.options import OPTIONS, add

    assert [f.name for f in dataclasses.fields(RunOptions) if f.name != "sources"] == list(OPTIONS)
    parser = argparse.ArgumentParser()
    add(parser, *[name for name, row in OPTIONS.items() if row.flag])
    args = parser.parse_args(["--no-publish", "--builder", "a=unix:///x.sock", "--builder",
                              "ssh://root@h", "--on", "ssh://root@gpu", "--fixture", "broken",
                              "--index-url", "https://mirror.example/simple/"])
    options = resolve(args, {}, env={})
    assert options.publish is False and options.sources["publish"] == "--no-publish"
    assert options.builders == ["a=unix:///x.sock", "ssh://root@h"]
    assert options.smoke_on == "ssh://root@gpu" and options.fixture == "broken"
    assert options.index_url == "https://mirror.example/simple"
    assert resolve(parser.parse_args([]), {}, env={}).publish is True  # a switch not given
    with pytest.raises(Exception, match="--fixture 'odd'"):
        resolve(parser.parse_args(["--fixture", "odd"]), {}, env={})


def test_options_without_a_flag_come_from_their_variables_through_the_table():
    from infermatrix.errors import UsageError
    from infermatrix.options import from_environment, package_index

    assert from_environment("index_url", env={"UV_INDEX_URL": "https://b.example/simple"}) == \
        "https://b.example/simple"
    assert from_environment("index_url", env={"INFERMATRIX_INDEX_URL": "https://a.example/s",
                                              "PIP_INDEX_URL": "https://c.example/s"}) == \
        "https://a.example/s"  # the first variable set wins
    assert from_environment("index_ttl_s", env={}) is None
    assert from_environment("index_ttl_s", env={"INFERMATRIX_INDEX_TTL": "0"}) == 0.0
    with pytest.raises(UsageError, match="INFERMATRIX_INDEX_TTL '-1'"):
        from_environment("index_ttl_s", env={"INFERMATRIX_INDEX_TTL": "-1"})
    with pytest.raises(UsageError, match="INFERMATRIX_CUOBJDUMP '/no/such'"):
        from_environment("cuobjdump", env={"INFERMATRIX_CUOBJDUMP": "/no/such"})
    assert package_index().startswith(("http://", "https://", "file://"))
    with pytest.raises(TypeError, match="not run options: echo"):
        resolve(None, {}, env={}, echo=print)


def test_each_cells_lock_is_read_once_in_a_run(ctx, monkeypatch):
    """Issue 28: the steps share one CellSpec per cell (Context.spec); render, build, audit and
    smoke all take it, so the lock is read and parsed once per cell per run."""
    import collections

    from infermatrix.model import spec

    reads: collections.Counter[str] = collections.Counter()
    real = spec.read_lock_text

    def counting(path, cell_id):
        reads[cell_id] += 1
        return real(path, cell_id)

    monkeypatch.setattr(spec, "read_lock_text", counting)
    _, _, records, run = run_wired(ctx)
    rendered = {r.name: r for r in records}["render"].passed
    assert rendered and set(reads) == set(rendered)
    assert set(reads.values()) == {1}, reads
    assert {r.name: r for r in records}["smoke"].passed  # the spec went as far as smoke


def test_a_builder_step_after_every_cell_failed_runs_on_no_cell(ctx):
    """With --builder given and no cell left (the CI run where smoke failed the one cell),
    the tag and smoke steps run on no cell instead of crashing on an empty builder group."""
    run = Run(ctx, [], RunOptions(builders=["loop=ssh://root@127.0.0.1:9"]),
              docker=RecordingEngine())
    records = stages.run_steps(run, stages.steps_named("smoke", "tag"))
    assert [r.status for r in records] == [StepStatus.NOTHING_TO_DO] * 2
    assert not any(r.passed or r.failed for r in records)


def test_the_step_table_lists_the_step_modules_in_the_journals_order():
    """Issue 49: the step table is static (a literal list of modules, typed by a Protocol for
    mypy), in the order of the journal's stage names, each module with its `step`."""
    modules = stages.step_modules()
    assert [name for name, _ in modules] == list(journal.STAGES) == list(stages.STEP_NAMES)
    assert [m.__name__.rsplit(".", 1)[1] for _, m in modules] == [
        "plan", "lock", "render", "base", "build", "audit", "smoke", "tagging", "publish",
        "train", "report"]
    assert all(callable(m.step) for _, m in modules)
    assert [step.__name__ for _, step in stages.STEPS] == [f"{n}.step" for n in journal.STAGES]
