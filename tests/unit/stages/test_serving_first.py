"""Serving first (issue 47): training-only kernels (matrix.yaml `build.kernels.<k>.profile:
train`) are not in the serving image (`runtime`), only in the `train` target built FROM it
after the run's serving images. Render, build's choice of keys and target, the step order,
the train step's choice of cells and its coverage judgement, the forecast. No Docker."""

from __future__ import annotations

import zipfile

import pytest

from infermatrix import journal
from infermatrix.context import Context
from infermatrix.model.coverage import DeviceCode, Arch
from infermatrix.model.forecast import CellWork, KernelWork, forecast
from infermatrix.stages import STEP_NAMES, build, plan_cells, render, train
from infermatrix.state import StatePaths
from tests.paths import REPO
from tests.support.render_support import render_to
from tests.support.train_support import SOURCE_CELL, TRAIN_CELL, train_matrix

VLLM = "cu130-torch2.14.0-vllm0.33.0-sm120"
SGLANG = "cu130-torch2.14.1-sglang0.5.23-sm120"


def _dockerfile(cell_id: str) -> str:
    return (REPO / "images" / cell_id / "Dockerfile").read_text()


def _runs(stage: str) -> list[str]:
    return [ln for ln in stage.splitlines() if not ln.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def train_ctx(tmp_path_factory) -> Context:
    root = tmp_path_factory.mktemp("train-matrix")
    return Context.load(train_matrix(root), root / ".state", offline=True)


@pytest.fixture(scope="module")
def train_spec(train_ctx):
    return train_ctx.specs(plan_cells(train_ctx, [TRAIN_CELL]))[0]


# ---- data ---------------------------------------------------------------------------------

def test_which_kernels_are_training_only_is_matrix_data(tmp_path):
    ctx = Context.load(REPO / "matrix.yaml", tmp_path / "state", offline=True)
    kernels = ctx.matrix.build["kernels"]
    assert kernels["flash-attn"]["profile"] == "train"
    assert "profile" not in kernels["flashinfer"]  # serve, the default


def test_the_profile_reaches_the_spec_and_only_from_the_data(train_ctx, train_spec, tmp_path):
    assert [k.name for k in train_spec.train_kernels] == ["cudakern"]
    assert train_spec.serve_kernels == ()
    # the same cell of the unedited test matrix: the kernel is the serving image's
    plain = Context.load(REPO / "tests" / "matrix" / "matrix.yaml", tmp_path / "s", offline=True)
    spec = plain.specs(plan_cells(plain, [SOURCE_CELL]))[0]
    assert spec.train_kernels == () and [k.name for k in spec.serve_kernels] == ["cudakern"]


# ---- render -------------------------------------------------------------------------------

def test_the_shipped_vllm_serving_image_has_no_flash_attn_and_its_train_target_has(tmp_path):
    text = _dockerfile(VLLM)
    runtime = build.stage_text(text, "runtime")
    trained = build.stage_text(text, "train")
    assert trained.splitlines()[0] == "FROM runtime AS train"
    assert not any("flash_attn" in ln or "flash-attn" in ln for ln in _runs(runtime))
    assert "kernels-cached" not in runtime  # nothing else compiled for the serving image
    install = [ln for ln in _runs(trained) if "uv pip install" in ln]
    assert install == ["    uv pip install --no-deps /tmp/kernel-wheels/flash_attn-*.whl"]
    assert "from=kernels-train-cached" in trained
    assert 'io.infermatrix.kernels.train="flash-attn=2.8.3"' in trained
    assert 'io.infermatrix.profile="train"' in trained
    assert 'io.infermatrix.kernels=""' in runtime and 'io.infermatrix.profile="serve"' in runtime
    # the kernel stages are still there: the train step compiles from the same toolchain
    assert build.kernel_stages(text) == ["flash-attn"]
    assert build.serving_target(text) == "runtime"
    assert (REPO / "images" / VLLM / "kernel-wheels-train" / ".keep").is_file()


def test_a_cell_without_training_kernels_renders_no_train_target():
    text = _dockerfile(SGLANG)
    assert not build.has_stage(text, "train") and build.serving_target(text) is None
    runtime = build.stage_text(text, "runtime")
    assert "infermatrix_flashinfer_aot-*.whl" in runtime  # a serving kernel stays in it


def test_render_puts_the_training_kernel_only_in_the_train_target(train_ctx, train_spec):
    out = render.render_cell(train_ctx, train_spec)
    text = out.files["Dockerfile"][0].decode()
    runtime, trained = build.stage_text(text, "runtime"), build.stage_text(text, "train")
    assert not any("cudakern" in ln for ln in _runs(runtime))
    assert any("/tmp/kernel-wheels/cudakern-*.whl" in ln for ln in _runs(trained))
    assert "kernel-wheels-train/.keep" in out.files
    assert text.rstrip().endswith('io.infermatrix.profile="train"')


def test_a_training_kernel_on_a_cell_for_another_cpu_is_refused(tmp_path):
    from infermatrix.errors import ConfigError

    root = tmp_path / "m"
    path = train_matrix(root)
    path.write_text(path.read_text().replace("platforms: {sm_121: linux/amd64}",
                                             "platforms: {sm_121: linux/arm64}"))
    ctx = Context.load(path, root / ".state", offline=True)
    spec = ctx.specs(plan_cells(ctx, ["cu130-torch2.13.0-kernel-fixture1.0-sm121"]))[0]
    with pytest.raises(ConfigError, match="training-only kernels"):
        render.render_cell(ctx, spec)


# ---- build: the serving image's keys and target; the step order ---------------------------

def test_the_serving_build_leaves_the_training_keys_to_the_train_step(train_ctx, train_spec):
    render_to(train_ctx, plan_cells(train_ctx, [TRAIN_CELL]), train_ctx.images_dir)
    text = (train_ctx.images_dir / TRAIN_CELL / "Dockerfile").read_text()
    keys = build.kernel_keys_for(train_ctx, train_spec, text)
    serving, training = build.split_keys(train_spec, keys)
    assert serving == {} and list(training) == ["cudakern"]
    assert build.profile_keys(train_ctx, train_spec) == {}
    assert list(build.profile_keys(train_ctx, train_spec, train=True)) == ["cudakern"]
    # the serving compile plan has nothing to compile; the train step's has the kernel
    assert build._kernels_to_compile(train_ctx, train_spec) == []
    assert build._kernels_to_compile(train_ctx, train_spec, train=True) == [keys["cudakern"]]


def test_the_train_step_runs_after_the_serving_steps():
    order = list(STEP_NAMES)
    assert order.index("train") > max(order.index(s) for s in
                                       ("build", "audit", "smoke", "tag", "publish"))
    assert order[-1] == "report"


def test_the_train_step_takes_cells_whose_serving_image_is_there(tmp_path, train_spec):
    state = StatePaths(tmp_path / "state")

    def record() -> journal.CellRecord:
        return journal.cell_record(state, TRAIN_CELL)

    assert not train.serving_built(record())  # nothing built
    journal.record_stage(state, TRAIN_CELL, "build", journal.Status.PASS)
    journal.record_stage(state, TRAIN_CELL, "tag", journal.Status.SKIP,
                         reason="built, not verified")
    assert train.serving_built(record())  # untagged on a GPU-less host: still trained
    journal.record_stage(state, TRAIN_CELL, "smoke", journal.Status.FAIL, reason="x")
    assert not train.serving_built(record())  # a failed serving image: nothing built on it


def test_the_training_hash_follows_the_serving_image_and_the_training_keys(train_ctx,
                                                                           train_spec):
    text = (train_ctx.images_dir / TRAIN_CELL / "Dockerfile")
    if not text.is_file():
        render_to(train_ctx, plan_cells(train_ctx, [TRAIN_CELL]), train_ctx.images_dir)
    keys = build.split_keys(train_spec, build.kernel_keys_for(
        train_ctx, train_spec, text.read_text()))[1]
    one = train.train_hash("sha256:a", keys)
    assert one == train.train_hash("sha256:a", keys) != train.train_hash("sha256:b", keys)
    assert one != train.train_hash("sha256:a", {})


# ---- the check of the training image ------------------------------------------------------

def test_coverage_passes_only_when_every_object_with_gpu_code_runs_on_the_arch():
    sm120 = DeviceCode(cubins=(Arch.parse("sm_120"),))
    sm90 = DeviceCode(cubins=(Arch.parse("sm_90"),))
    host = DeviceCode()
    good = train.judge_coverage({"/a.so": sm120, "/host.so": host}, "sm_120")
    assert good["passed"] and good["summary"] == "1 object(s) cover sm_120"
    bad = train.judge_coverage({"/a.so": sm120, "/b.so": sm90}, "sm_120")
    assert not bad["passed"] and "b.so" in bad["summary"]
    assert bad["objects"]["/b.so"]["coverage"] == "uncovered"
    none = train.judge_coverage({"/host.so": host}, "sm_120")
    assert not none["passed"] and none["summary"].startswith("no GPU code")


def test_the_objects_checked_are_the_wheels_shared_objects_where_the_venv_has_them(tmp_path):
    wheel = tmp_path / "k-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("k/__init__.py", "")
        archive.writestr("k/libk.so", b"\x7fELF-one")
        archive.writestr("k_cuda.cpython-311-x86_64-linux-gnu.so", b"\x7fELF-two")
    found = train.gpu_objects([wheel], "3.11")
    site = "/opt/venv/lib/python3.11/site-packages"
    assert [o["path"] for o in found] == [f"{site}/k/libk.so",
                                          f"{site}/k_cuda.cpython-311-x86_64-linux-gnu.so"]
    import hashlib
    assert found[0]["sha256"] == hashlib.sha256(b"\x7fELF-one").hexdigest()


# ---- the forecast -------------------------------------------------------------------------

FA = KernelWork("flash-attn", "fa", 3000.0, "model", train=True)
FI = KernelWork("flashinfer", "fi", 300.0, "history")


def _cell(cell_id: str, *kernels: KernelWork) -> CellWork:
    return CellWork(cell_id, 420.0, "default", kernels, 1.0, 40.0, 7.6, train_image_s=60.0)


def test_the_serving_image_does_not_wait_for_a_training_compile():
    result = forecast([_cell("vllm", FA), _cell("sglang", FI)], slots=1)
    vllm, sglang = result.cells
    assert vllm.seconds == 420.0 and vllm.compile_s == 0.0  # serving: no flash-attn
    assert vllm.servable_s == 420.0 and sglang.servable_s == 420.0 + 720.0
    # the training image after every serving build: its compile and its own image step
    assert vllm.train_s == 3060.0 and vllm.train_done_s == 1140.0 + 3060.0
    assert sglang.train_done_s is None
    assert result.total_s == 4200.0 and result.critical_path[-1] == "vllm (train)"
    assert "flash-attn 50m00s (model)" in vllm.train_kernels


def test_a_cached_or_unchanged_training_image_costs_nothing():
    cached = KernelWork("flash-attn", "fa", 3000.0, "model", cached=True, train=True)
    result = forecast([_cell("vllm", cached)], slots=1)
    assert result.cells[0].train_s == 60.0 and result.total_s == 480.0  # the image step only
    done = CellWork("vllm", 420.0, "default", (FA,), 1.0, 40.0, 7.6, reused=True,
                    train_reused=True)
    result = forecast([done], slots=1)
    assert result.total_s == 0.0 and result.cells[0].train_kernels == "unchanged"


def test_an_emulated_training_compile_over_the_limit_leaves_the_serving_image_built():
    arm = CellWork("arm", 420.0, "default", (FA,), 15.0, 40.0, 7.6)
    result = forecast([arm], slots=1, emulation_limit_s=3600.0)
    cell = result.cells[0]
    assert cell.seconds == 420.0 and cell.servable_s == 420.0 and cell.train_s == 0.0
    assert "training image not built" in cell.note


def test_the_forecast_table_says_time_to_servable_and_to_the_training_image():
    from infermatrix.stages.forecast import forecast_lines

    result = forecast([_cell("vllm", FA), _cell("sglang", FI)], slots=1)
    lines = forecast_lines(result)
    assert lines[0].split()[:4] == ["cell", "time", "servable", "train"]
    vllm = next(ln for ln in lines if ln.startswith("vllm"))
    assert vllm.split()[1:4] == ["7m00s", "7m00s", "1h10m"]  # 420 s; 1140 + 3060 s
    assert "train: flash-attn 50m00s (model)" in vllm
    sglang = next(ln for ln in lines if ln.startswith("sglang"))
    assert sglang.split()[1:4] == ["12m00s", "19m00s", "-"]


def test_audit_and_smoke_expect_no_training_kernel_in_the_serving_image(train_ctx, train_spec,
                                                                        tmp_path):
    """Found by the real vLLM cell: the audit's pin check wanted flash-attn==2.8.3 in the
    serving image. The audit and the smoke levels judge the serving image by its own kernels."""
    from infermatrix.stages import smoke
    from infermatrix.stages.audit import expected_pins

    assert "cudakern" not in expected_pins(train_spec)
    assert smoke.kernel_distributions(train_ctx, train_spec) == []
    plain = Context.load(REPO / "tests" / "matrix" / "matrix.yaml", tmp_path / "s", offline=True)
    spec = plain.specs(plan_cells(plain, [SOURCE_CELL]))[0]
    assert expected_pins(spec)["cudakern"][0] == "0.1.0"  # a serving kernel is still expected
    assert smoke.kernel_distributions(plain, spec) == ["cudakern==0.1.0"]


class LayersEngineStandIn:
    """Answers `image_layers` only: a training image whose `runtime` layers were rebuilt is a
    fault the real engine shows only after a prune or an unreproducible step (the real path:
    tests/docker/test_train_target.py)."""

    def __init__(self, layers: dict[str, list[str]]) -> None:
        self.layers = layers

    def image_layers(self, ref: str) -> list[str]:
        return self.layers.get(ref, [])


def test_a_training_image_not_on_the_serving_images_layers_is_refused():
    serving = ["sha256:a", "sha256:b", "sha256:c"]
    engine = LayersEngineStandIn({"serving": serving, "on-it": [*serving, "sha256:w"],
                                  "rebuilt": ["sha256:a", "sha256:x", "sha256:y", "sha256:w"]})
    assert train.not_on_serving_image(engine, "on-it", "serving") is None
    rebuilt = train.not_on_serving_image(engine, "rebuilt", "serving")
    assert rebuilt and "not built on the serving image" in rebuilt and "layer 2 of 3" in rebuilt
    assert "not in Docker" in (train.not_on_serving_image(engine, "on-it", "gone") or "")
    assert train.not_on_serving_image(engine, "serving", "serving")  # adds nothing: not a train image
