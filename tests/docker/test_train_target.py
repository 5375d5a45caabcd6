"""Serving first on the real engine (issue 47): the fixture cell of the test matrix with its
kernel cudakern made training-only (`profile: train`, tests/support/train_support.py). The
build step builds the serving image (`--target runtime`) without compiling or installing the
kernel; the train step then compiles it, builds the `train` target FROM that image, reads its
cubins for sm_120 out of the image and records the journal's train stage."""

from __future__ import annotations

import subprocess

import pytest

from infermatrix import journal
from infermatrix.context import Context
from infermatrix.engine import docker as engine
from infermatrix.options import RunOptions
from infermatrix.stages import plan_cells, render, train
from infermatrix.stages.build import build_cells, local_ref, train_ref
from tests.support.train_support import TRAIN_CELL, train_matrix

DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

FINDS = ("import importlib.util, sys; "
         "sys.exit(0 if importlib.util.find_spec('cudakern') else 3)")


def _has_cudakern(image: str) -> bool:
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c",
                           FINDS], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


def _build_commands(ctx: Context, stage: str) -> list[str]:
    """`--target T --tag R` of each image build the stage's log names (its exact commands,
    each on a `$ ` line), kernel exports (--output) left out."""
    found = []
    for line in ctx.state.cell_log(TRAIN_CELL, stage).read_text().splitlines():
        words = line.split()
        if line.startswith("$ ") and " build " in line and "--tag" in words:
            target = words[words.index("--target") + 1] if "--target" in words else "-"
            found.append(f"--target {target} --tag {words[words.index('--tag') + 1]}")
    return found


def _layers(image: str) -> list[str]:
    return DOCKER.image_layers(image)


@pytest.fixture(scope="module")
def two_targets(built_base, tmp_path_factory):
    root = tmp_path_factory.mktemp("train-cell")
    path = train_matrix(root)
    # never prune the shared engine's cache from a test (other lanes build on it)
    path.write_text(path.read_text().replace("disk: {min_free_gib: 12}", "disk: {min_free_gib: 0}"))
    ctx = Context.load(path, root / ".state")
    plans = plan_cells(ctx, [TRAIN_CELL])
    render.render_cells(ctx, plans)
    cells = ctx.specs(plans)
    built = build_cells(ctx, cells, RunOptions(), docker=DOCKER)[TRAIN_CELL]
    trained = train.train_cells(ctx, cells, RunOptions(), docker=DOCKER)[TRAIN_CELL]
    yield ctx, cells, built, trained
    for ref in (local_ref(TRAIN_CELL), train_ref(TRAIN_CELL)):
        DOCKER.remove_image(ref, force=True)


def test_the_serving_image_is_built_without_the_training_kernel(two_targets):
    ctx, _, built, _ = two_targets
    assert built.status == "pass", built.summary()
    assert built.kernels == {}  # nothing compiled for the serving image
    assert not _has_cudakern(local_ref(TRAIN_CELL))
    assert _build_commands(ctx, "build") == [f"--target runtime --tag {local_ref(TRAIN_CELL)}"]


def test_the_train_target_adds_the_kernel_on_top_of_the_serving_image(two_targets):
    ctx, _, built, trained = two_targets
    assert trained.status == "pass", trained.summary()
    assert trained.kernels["cudakern"]["cache"] == "miss"  # compiled by the train step
    assert _has_cudakern(train_ref(TRAIN_CELL))
    serving, training = _layers(built.image_id), _layers(trained.image_id)
    assert len(training) > len(serving) and training[:len(serving)] == serving
    objects = trained.coverage["objects"]
    assert trained.coverage["passed"] and trained.coverage["arch"] == "sm_120"
    assert any(path.endswith("/cudakern/libcudakern.so") and "sm_120" in o["cubins"]
               and o["coverage"] == "exact" for path, o in objects.items()), objects
    assert _build_commands(ctx, "train") == [f"--target train --tag {train_ref(TRAIN_CELL)}"]
    stage = journal.cell_record(ctx.state, TRAIN_CELL).stage("train")
    assert stage.status == journal.Status.PASS and stage.details["image_id"] == trained.image_id
    # the serving record is untouched: audit, smoke and tag still work on the serving image
    assert journal.cell_record(ctx.state, TRAIN_CELL).image_id == built.image_id


def test_a_rerun_reuses_the_training_image(two_targets):
    ctx, cells, _, trained = two_targets
    again = train.train_cells(ctx, cells, RunOptions(), docker=DOCKER)[TRAIN_CELL]
    assert again.status == "pass" and again.reused and again.image_id == trained.image_id


def test_no_cache_never_rebuilds_the_serving_layers_under_the_training_image(two_targets):
    """With BuildKit's --no-cache (INFERMATRIX_NO_CACHE, the cold benchmarks) the train target's
    image build still takes the `runtime` stage from the serving build: the training image is
    the tested serving image plus its own layers. (Found in a cold main job: the --no-cache
    train build rebuilt the whole serving venv beside it and ran the disk full.)"""
    ctx, cells, built, _ = two_targets
    again = train.train_cells(ctx, cells, RunOptions(force=True, no_cache=True),
                              docker=DOCKER)[TRAIN_CELL]
    assert again.status == "pass", again.summary()
    serving, training = _layers(built.image_id), _layers(again.image_id)
    assert len(training) > len(serving) and training[:len(serving)] == serving
    builds = [line for line in ctx.state.cell_log(TRAIN_CELL, "train").read_text().splitlines()
              if line.startswith("$ ") and " build " in line and "--target train" in line]
    assert builds and not any("--no-cache" in line.split() for line in builds), builds
