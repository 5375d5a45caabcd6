"""A rendered kernel stage built for real: the fixture kernel compiled for exactly the cell's
arch (render's unit tests: tests/unit/stages/test_render.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infermatrix.context import Context
from infermatrix.stages import base
from tests.support.render_support import render_to
from tests.unit.stages.test_render import TEST_MATRIX, fixture_plan


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_rendered_kernel_stage_compiles_the_fixture_for_exactly_the_cells_arch(tmp_path: Path) -> None:
    """A real BuildKit build of `--target kernel-cudakern` (CUDA 13 wheels toolchain, torch from
    PyPI) exports only /wheels/, and the wheel's library holds sm_121 code and no other arch."""
    import zipfile

    from infermatrix.engine import docker as engine

    ctx = Context.load(TEST_MATRIX)
    plan = fixture_plan("sm_121")
    base_ref = base.image_ref(ctx.matrix, "bookworm", "linux/amd64")
    if not engine.Engine().available() or not engine.Engine().image_exists(base_ref):
        pytest.skip(f"needs Docker and the base image {base_ref} (infermatrix base build)")
    [dockerfile] = render_to(ctx, [plan], tmp_path / "images")
    out = tmp_path / "out"
    engine.Engine().build_image(engine.BuildRequest(
        dockerfile.parent, target="kernel-cudakern", output_dir=out,
        build_args={"MAX_JOBS": "2", "NVCC_THREADS": "1"},
        secrets={"ca_bundle": Path("/etc/ssl/certs/ca-certificates.crt")}),
        log_path=tmp_path / "build.log", timeout=1800)
    exported = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    # the wheel, and the compile's own measurement (templates/files/measure.sh) beside it
    wheels = [p for p in exported if p.endswith(".whl")]
    assert len(wheels) == 1 and re.fullmatch(r"wheels/cudakern-0\.1\.0-.*\.whl", wheels[0])
    assert sorted(set(exported) - set(wheels)) == ["wheels/cudakern.build-stats.json"]
    with zipfile.ZipFile(out / wheels[0]) as wheel:
        library = next(wheel.read(n) for n in wheel.namelist() if n.endswith(".so"))
    arches = set(re.findall(rb"sm_1[0-9]{2}[af]?", library))
    assert arches == {b"sm_121"}, arches
