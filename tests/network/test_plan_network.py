"""The planner against the real package index: the assertions say what the index says today
(the newest release of each engine is planned with the torch it pins; every planned cell of the
shipped matrix has a committed lock), never fixed version numbers."""

from __future__ import annotations

from tests.paths import REPO


import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from infermatrix.context import Context
from infermatrix.model.index import MetadataCache, release_list
from infermatrix.stages.plan import plan_full, plan_matrix

from tests.support.planning_support import RECORDED

ROOT = REPO
SHIPPED = ROOT / "matrix.yaml"
pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def live_cache(tmp_path_factory) -> MetadataCache:
    return MetadataCache(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    ctx = Context.load(SHIPPED, state)
    return ctx, plan_full(ctx)


@pytest.mark.parametrize("name, version", sorted(RECORDED))
def test_recorded_answers_match_the_live_index(live_cache, name, version):
    live = live_cache.release(name, version)
    wanted = "torch" if name != "torch" else None
    if wanted:
        assert [str(r) for r in live.pins_for("torch")][0].split(";")[0].replace(" ", "") == \
            RECORDED[(name, version)][0].split(";")[0].replace(" ", "")
    else:
        runtime = [r for r in live.requires_dist if "cuda-runtime" in r or "cudart" in r]
        assert runtime and runtime[0].split("==")[1][:4] == RECORDED[(name, version)][0].split("==")[1][:4]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_newest_release_on_the_index_is_planned_with_its_own_torch(shipped, live_cache,
                                                                       tmp_path, engine):
    ctx, plan = shipped
    floor = ctx.matrix.floors[engine]
    listing = release_list(tmp_path, engine, ttl_s=0)
    newest = listing.newest(floor, 1)[0]
    oldest = listing.newest(floor, len(listing.versions))[-1]
    planned = [p for p in plan.cells if p.planned and p.cell.engine == engine]
    latest = [p for p in planned if p.resolution["selector"].startswith("latest")]
    assert latest, f"{engine}: no cell planned for `latest`"
    chosen = latest[0].cell.engine_version
    if chosen != newest:  # the newest release cannot install yet: passed over, and said why
        assert any(why.startswith(f"{newest}: it pins ")
                   for why in latest[0].resolution.get("passed_over", [])), \
            f"{engine} {newest} (newest on the index) is neither planned nor passed over"
    pin = live_cache.release(engine, chosen).pins_for("torch")[0]
    torch = next(s.version for s in Requirement(str(pin)).specifier if s.operator == "==")
    newest_cells = [p for p in planned if p.cell.engine_version == chosen]
    assert {p.cell.torch for p in newest_cells} == {torch}
    assert {p.cell.arch for p in newest_cells} == {"sm_120", "sm_121"}
    assert all(p.resolution["selector"].startswith("latest") for p in newest_cells)
    # the card's floor release is planned too, and nothing below the floor is
    assert any(p.cell.engine_version == oldest for p in planned)
    assert all(SpecifierSet(str(floor)).contains(p.cell.engine_version) for p in planned)


def test_every_planned_cell_of_the_shipped_matrix_has_a_lock(shipped):
    ctx, plan = shipped
    planned = {p.id for p in plan.cells if p.planned}
    locks = {p.stem for p in (ROOT / "locks").glob("*.txt")}
    assert planned and planned <= locks, f"planned without a lock: {sorted(planned - locks)}"
    assert locks <= planned, f"stale locks: {sorted(locks - planned)}"


def test_torch_pypi_cuda_is_read_from_metadata(live_cache):
    from infermatrix.model.rules import cuda_of_requirements
    newest = max(release_list(live_cache.root, "torch", ttl_s=0).versions, key=Version)
    cuda = cuda_of_requirements(live_cache.release("torch", newest).requires_dist)
    assert cuda != "cpu" and Version(cuda) >= Version("13.0")


def test_offline_mode_answers_from_the_cache(tmp_path):
    state = tmp_path / "state"
    online = Context.load(SHIPPED, state)
    first = [p.as_dict() for p in plan_matrix(online, select=["cpu-*", "*sglang0.5.10*"])]
    offline = Context.load(SHIPPED, state, offline=True)
    assert [p.as_dict() for p in plan_matrix(offline, select=["cpu-*", "*sglang0.5.10*"])] == first
    cold = Context.load(SHIPPED, tmp_path / "cold", offline=True)
    statuses = {p.status for p in plan_matrix(cold)}
    assert "unresolved" in statuses and "planned" not in statuses
