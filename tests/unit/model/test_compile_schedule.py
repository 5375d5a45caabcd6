"""No idle core (issue 47): a kernel compile starts with the CPUs and memory the compiles under
way leave, or waits for one to end; the memory cap holds. The decision is pure
(compileplan.jobs_for_next_compile); the gate that applies it is real threads."""

from __future__ import annotations

import threading

import pytest

from infermatrix.model.compileplan import jobs_for_next_compile, plan_compile
from infermatrix.stages.build import CompileGate

GIB = 1024 ** 3


@pytest.mark.parametrize(("cpus", "usable", "job", "jobs_in", "useful", "expected"), [
    (2, 21.1, 7.59, 0, 73, 2),     # issue 47's host: flash-attn alone at two jobs, not one
    (2, 21.1, 7.59, 2, 20, 0),     # the other compile waits for it, then gets both cores
    (2, 21.1, 7.59, 1, 73, 1),     # one core left: it takes it
    (128, 500.0, 7.59, 0, 21, 21),  # a large host: no more jobs than the compile has files
    (128, 500.0, 7.59, 21, 73, 44),  # the memory binds: (500 - 21 x 7.59) / 7.59 = 44.9
    (16, 10.0, 7.59, 0, 73, 1),    # memory for one job: one
    (16, 5.0, 7.59, 0, 73, 1),     # not even one fits: one still runs when nothing else does
    (16, 5.0, 7.59, 1, 73, 0),     # ... but never beside another
])
def test_the_width_of_the_next_compile(cpus, usable, job, jobs_in, useful, expected):
    assert jobs_for_next_compile(cpus, usable, job, jobs_in, jobs_in * job, useful) == expected


def test_the_memory_cap_holds_over_every_sequence_of_starts():
    cpus, usable, job = 16, 40.0, 6.0
    in_flight: list[int] = []
    for useful in (73, 20, 5, 73, 73):
        jobs = jobs_for_next_compile(cpus, usable, job, sum(in_flight), sum(in_flight) * job,
                                     useful)
        if jobs:
            in_flight.append(jobs)
        assert sum(in_flight) * job <= usable and sum(in_flight) <= cpus


def test_an_override_runs_at_its_width_when_it_fits_or_nothing_else_compiles():
    assert jobs_for_next_compile(2, 21.1, 7.59, 0, 0.0, 73, override=1) == 1
    assert jobs_for_next_compile(2, 21.1, 7.59, 1, 7.59, 73, override=1) == 1
    assert jobs_for_next_compile(2, 21.1, 7.59, 2, 15.18, 73, override=1) == 0
    assert jobs_for_next_compile(2, 21.1, 7.59, 0, 0.0, 73, override=8) == 8


def test_a_compile_that_waits_gets_the_cores_of_the_one_that_ended():
    plan = plan_compile(int(23.1 * GIB), 2, 6.6, max_parallel_cells=2, cells_to_compile=2)
    assert plan.max_jobs == 1  # the static plan: each of two cells at one job (issue 47)
    gate = CompileGate(plan)
    first = gate.acquire(73, lambda _: None)
    assert first == 2
    said: list[str] = []
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(gate.acquire(20, said.append)))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and not got and "waiting for the compile(s) under way" in said[0]
    gate.release(first)  # the first compile ended (or its cell failed)
    waiter.join(timeout=5)
    assert got == [2] and gate.jobs == 2
    gate.release(2)
    assert gate.jobs == 0


def test_a_compile_waiting_for_width_gives_up_when_the_run_is_interrupted(monkeypatch):
    from infermatrix import proc
    from infermatrix.errors import StageFailure

    gate = CompileGate(plan_compile(int(23.1 * GIB), 2, 6.6))
    gate.acquire(73, lambda _: None)  # both cores taken, never given back
    monkeypatch.setattr(proc, "STOPPING", threading.Event())
    proc.STOPPING.set()
    with pytest.raises(StageFailure, match="interrupted"):
        gate.acquire(20, lambda _: None)


def test_flash_attn_is_the_shipped_training_only_kernel(tmp_path):
    from infermatrix.context import Context
    from tests.paths import REPO

    ctx = Context.load(REPO / "matrix.yaml", tmp_path / "state", offline=True)
    consumers = {name: spec.get("consumer", "") for name, spec in
                 ctx.matrix.build["kernels"].items()}
    assert consumers["flash-attn"].startswith("profile training")
    assert not consumers["flashinfer"].startswith("profile training")
