"""The whole test suite in lanes, measured (issue 26): what `uvx nox -s tests` runs.

    python -m tests.lanes [--state-dir DIR]

Phases, each timed, the lanes side by side:
- `collect`: the whole collection once (its count is checked against the lanes' total and the
  floor of tests/ci_rules.py);
- `bases-test`, `bases-real-amd64`, `bases-real-arm64`: every base image the tests need, built
  on the machine's engine side by side with the unit lane;
- lane `unit`: tests that need no Docker (`-m "not docker"`), from the start;
- lanes `docker-cpu` and `docker`: the Docker tests on the machine's engine (`-m "docker and
  not realcell"`), side by side once the test matrix's base exists (`bases-test`): the modules
  of the CPU cell's image (DOCKER_CPU_MODULES) in `docker-cpu`, every other one in `docker`;
- lane `real`: the real engine cells (`-m realcell`) on their own private dockerd
  (tests/docker/test_build_real_cells.py), once the real matrix's amd64 base exists.

Each lane is a pytest process of its own with the CI=true rules of tests/conftest.py, a JUnit XML
and a log under DIR (default .state/ci), and `df` of the disk at its start and end. The run fails
when a lane fails, when the lanes together ran fewer tests than were collected (a lane's marker
expression left some out) or than the floor, or when the time guard stops the lanes: at
INFERMATRIX_CI_BUDGET_S (default 5400, CI's hard limit) less a margin, counted from
INFERMATRIX_CI_START (set by .ci/run: provisioning counts) or this runner's start, each running
lane gets SIGINT, so pytest still writes its report. At the end it prints the phases, the lanes'
counts, the slowest tests, and one line of the total time against the limit.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tests import ci_rules

ROOT = Path(__file__).resolve().parent.parent
CI_LIMIT_S = 5400  # CI's hard limit: 90 minutes
GUARD_MARGIN_S = 240  # stop the lanes this long before the limit, so reports still get written
SLOWEST = 15


@dataclass
class Phase:
    name: str
    argv: list[str]
    after: tuple[str, ...] = ()  # phases that must end (successfully) before this one starts
    junit: Path | None = None
    log: Path | None = None
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    process: subprocess.Popen[str] | None = field(default=None, repr=False)
    disk: list[str] = field(default_factory=list)
    nice: int = 0  # niceness: a lane with slack yields the CPU to the critical ones
    cpu_s: float | None = None  # user + system CPU of the lane and the processes it waited for
    env: dict[str, str] = field(default_factory=dict)  # on top of this runner's environment

    @property
    def seconds(self) -> float | None:
        return None if self.started is None or self.ended is None else self.ended - self.started


@dataclass
class LaneCounts:
    tests: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    node_ids: set[str] = field(default_factory=set)
    durations: list[tuple[float, str]] = field(default_factory=list)


class Runner:
    def __init__(self, phases: list[Phase], start: float, budget_s: float) -> None:
        self.phases = {p.name: p for p in phases}
        self.t0 = start
        self.deadline = start + budget_s - GUARD_MARGIN_S
        self.budget_s = budget_s
        self.print_lock = threading.Lock()
        self.guard_fired = False

    def say(self, text: str, lane: str = "lanes") -> None:
        with self.print_lock:
            print(f"[{lane} {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def offset(self, moment: float | None) -> str:
        return "-" if moment is None else f"{moment - self.t0:7.0f} s"

    # -- running ---------------------------------------------------------------------------
    def ready(self, phase: Phase) -> bool | None:
        """True: may start; False: wait; None: never (a phase it needs failed)."""
        needs = [self.phases[n] for n in phase.after]
        if any(n.returncode not in (None, 0) for n in needs):
            return None
        return all(n.returncode == 0 for n in needs)

    def start(self, phase: Phase) -> None:
        phase.disk.append(disk_line("start"))
        phase.started = time.monotonic()
        self.say(f"start: {' '.join(phase.argv)}  ({phase.disk[-1]})", phase.name)
        log = open(phase.log, "w") if phase.log else None  # noqa: SIM115 (closed by the pump)
        argv = ["nice", "-n", str(phase.nice), *phase.argv] if phase.nice else phase.argv
        phase.process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True,
                                         env={**os.environ, **phase.env,
                                              "INFERMATRIX_LANE": phase.name})
        threading.Thread(target=self.pump, args=(phase, log), daemon=True).start()

    def pump(self, phase: Phase, log) -> None:  # type: ignore[no-untyped-def]
        assert phase.process and phase.process.stdout
        for line in phase.process.stdout:
            if log:
                log.write(line)
                log.flush()
            with self.print_lock:
                print(f"[{phase.name}] {line}", end="", flush=True)
        if log:
            log.close()

    def run(self) -> None:
        pending = list(self.phases.values())
        running: list[Phase] = []
        while pending or running:
            for phase in list(pending):
                verdict = self.ready(phase)
                if verdict is None:
                    pending.remove(phase)
                    self.say(f"not started: {', '.join(phase.after)} did not pass", phase.name)
                elif verdict:
                    pending.remove(phase)
                    self.start(phase)
                    running.append(phase)
            for phase in list(running):
                assert phase.process
                if self.reap(phase):
                    phase.ended = time.monotonic()
                    phase.disk.append(disk_line("end"))
                    running.remove(phase)
                    self.say(f"ended, exit {phase.returncode}, {phase.seconds:.0f} s  "
                             f"({phase.disk[-1]})", phase.name)
            if running and not self.guard_fired and time.monotonic() > self.deadline:
                self.fire_guard(running)
            time.sleep(0.5)

    @staticmethod
    def reap(phase: Phase) -> bool:
        """Whether the phase's process ended; its exit code and CPU time (wait4's rusage:
        what Docker's daemon did for it is not in there) when it did."""
        assert phase.process
        pid, status, usage = os.wait4(phase.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        phase.process.returncode = phase.returncode = os.waitstatus_to_exitcode(status)
        phase.cpu_s = usage.ru_utime + usage.ru_stime
        return True

    def fire_guard(self, running: list[Phase]) -> None:
        """The time guard: SIGINT (pytest writes its report and JUnit XML, then exits)."""
        self.guard_fired = True
        self.say(f"TIME GUARD: {self.budget_s - GUARD_MARGIN_S:.0f} s of the {self.budget_s:.0f} s"
                 f" budget used; interrupting {', '.join(p.name for p in running)}")
        for phase in running:
            assert phase.process
            phase.process.send_signal(signal.SIGINT)


def disk_line(when: str) -> str:
    """Free space of the disk that holds Docker's data (and the private engines' data)."""
    path = "/var/lib" if Path("/var/lib").exists() else "/"
    usage = shutil.disk_usage(path)
    return f"df {path} at {when}: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.0f}"


def read_junit(path: Path) -> LaneCounts:
    counts = LaneCounts()
    if not path.is_file():
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        node = f"{case.get('classname', '')}::{case.get('name', '')}"
        if node in counts.node_ids:  # a teardown error is a second entry of the same test
            continue
        counts.node_ids.add(node)
        counts.tests += 1
        counts.failed += case.find("failure") is not None
        counts.errors += case.find("error") is not None
        counts.skipped += case.find("skipped") is not None
        counts.durations.append((float(case.get("time") or 0), node))
    return counts


def collected_count(log: Path | None) -> int | None:
    if not log or not log.is_file():
        return None
    found = re.findall(r"^(\d+) tests? collected", log.read_text(), re.MULTILINE)
    return int(found[-1]) if found else None


def pytest_argv(lane: str, marker: str, state: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", marker, "-p", "no:cacheprovider", "-ra",
            f"--junitxml={state / f'junit-{lane}.xml'}", "--durations=10",
            "-o", f"junit_suite_name={lane}", *extra]


# The Docker tests of the CPU cell's image, one lane of their own: they share that image and
# would break each other from two processes (test_publish_consumer removes it with all its
# tags; test_smoke_docker asserts that no container of the engine carries its smoke label).
# test_build_matrix last: it builds the CUDA fixture cells test_audit_docker (the other
# lane) builds first, so their layers are in BuildKit's cache by then.
DOCKER_CPU_MODULES = tuple(f"tests/docker/{name}.py" for name in (
    "test_pipeline", "test_smoke_docker", "test_throughput_docker", "test_generate_docker",
    "test_publish_consumer", "test_build_matrix", "test_workload_docker"))


# The 2 cores are the limit (measured: 0 % idle while the lanes run). The unit lane ends at
# about a third of the run, far off the critical path (the real and docker-cpu lanes), so it
# runs nice and yields the CPU to them; their work runs in Docker's daemon and containers,
# which a lane's niceness does not reach, so only the unit lane is niced.
LANE_NICENESS = {"unit": 15}


def infermatrix_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "infermatrix", *args]


# The unit lane talks to no engine: its DOCKER_HOST is a socket nobody answers, so a unit test
# that needs Docker without its `docker` mark fails here instead of passing on CI's engine.
LANE_ENV = {"unit": {"DOCKER_HOST": "unix:///nonexistent/infermatrix-unit-lane-has-no-engine.sock"}}


def phases_of(state: Path) -> list[Phase]:
    bases_state = str(state / "bases")
    phases = [
        Phase("collect", [sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider"], log=state / "collect.log"),
        # the test matrix's base (the docker lane's), and the real matrix's amd64 and arm64
        # ones (the real lane's; arm64's debootstrap runs its second stage emulated)
        Phase("bases-test", infermatrix_argv("base", "build", "--matrix",
                                             "tests/matrix/matrix.yaml", "--state-dir",
                                             bases_state), log=state / "bases-test.log"),
        *(Phase(f"bases-real-{arch}", infermatrix_argv(
            "base", "build", "--matrix", "tests/real/matrix.yaml", "--state-dir", bases_state,
            "--platform", f"linux/{arch}"), log=state / f"bases-real-{arch}.log")
          for arch in ("amd64", "arm64")),
    ]
    docker = "docker and not realcell"
    lanes = {"unit": ("not docker", (), ()),
             # the Docker tests in two lanes on the machine's engine, side by side: the CPU
             # cell's image in one, every other module (new ones included) in the other
             "docker-cpu": (docker, ("bases-test",), DOCKER_CPU_MODULES),
             "docker": (docker, ("bases-test",),
                        tuple(f"--ignore={m}" for m in DOCKER_CPU_MODULES)),
             # the arm64 base goes on building while the amd64 cells do: the GB10 test, last,
             # waits for it (base.build_base's host-wide lock per recipe)
             "real": ("realcell", ("bases-real-amd64",), ())}
    for lane, (marker, after, extra) in lanes.items():
        phases.append(Phase(lane, pytest_argv(lane, marker, state, extra), after=after,
                            junit=state / f"junit-{lane}.xml", log=state / f"{lane}.log",
                            nice=LANE_NICENESS.get(lane, 0), env=LANE_ENV.get(lane, {})))
    return phases


def run_problems(phases: list[Phase], counts: dict[str, LaneCounts], collected: int | None,
                 guard_fired: bool, floor: int) -> list[str]:
    """Why the whole run fails (empty: it passes): a phase that did not exit 0 (or never ran),
    lanes that together ran fewer distinct tests than the collection found, fewer than the floor,
    an unreadable collection count, the time guard having interrupted the lanes."""
    problems = [f"{p.name}: exit {p.returncode}" for p in phases if p.returncode != 0]
    ran = set().union(*(c.node_ids for c in counts.values())) if counts else set()
    if collected is None:
        problems.append("the collection count could not be read")
    elif len(ran) < collected:
        problems.append(f"the lanes ran {len(ran)} distinct tests of {collected} collected: "
                        "a lane's marker expression leaves some out")
    if len(ran) < floor:
        problems.append(f"{len(ran)} tests ran, fewer than the floor {floor}")
    if guard_fired:
        problems.append("the time guard interrupted the lanes")
    return problems


def report(runner: Runner) -> int:
    """Print the tables; the exit status of the whole run."""
    lanes = [p for p in runner.phases.values() if p.junit]
    counts = {p.name: read_junit(p.junit) for p in lanes if p.junit}
    collected = collected_count(runner.phases["collect"].log)

    print("\n== phases (wall time; lanes run side by side)")
    print(f"{'phase':10} {'start':>9} {'end':>9} {'wall':>8} {'cpu':>8}  exit")
    for phase in runner.phases.values():
        wall = f"{phase.seconds:6.0f} s" if phase.seconds is not None else "      -"
        cpu = f"{phase.cpu_s:6.0f} s" if phase.cpu_s is not None else "      -"
        print(f"{phase.name:10} {runner.offset(phase.started)} {runner.offset(phase.ended)} "
              f"{wall} {cpu}  {phase.returncode if phase.returncode is not None else 'not run'}"
              + (f"  (nice {phase.nice})" if phase.nice else ""))
        for line in phase.disk:
            print(f"{'':10}   {line}")

    print("\n== lanes")
    print(f"{'lane':10} {'tests':>6} {'failed':>7} {'errors':>7} {'skipped':>8}")
    for name, c in counts.items():
        print(f"{name:10} {c.tests:6} {c.failed:7} {c.errors:7} {c.skipped:8}")
    ran = set().union(*(c.node_ids for c in counts.values())) if counts else set()
    total = sum(c.tests for c in counts.values())
    print(f"{'all':10} {total:6}  (distinct {len(ran)}; collected {collected}; "
          f"floor {ci_rules.MIN_COLLECTED})")

    print(f"\n== the {SLOWEST} slowest tests (setup + call + teardown)")
    slowest = sorted(((secs, name, node) for name, c in counts.items()
                      for secs, node in c.durations), reverse=True)[:SLOWEST]
    for secs, lane, node in slowest:
        print(f"{secs:8.1f} s  {lane:10} {node}")

    problems = run_problems(list(runner.phases.values()), counts, collected,
                            runner.guard_fired, ci_rules.MIN_COLLECTED)
    total_s = time.monotonic() - runner.t0
    status = "FAILED" if problems else "passed"
    print(f"\n== CI {status}: {total_s:.0f} s ({total_s / 60:.1f} min) of the "
          f"{runner.budget_s:.0f} s ({runner.budget_s / 60:.0f} min) limit, "
          f"{100 * total_s / runner.budget_s:.0f}%")
    for problem in problems:
        print(f"   - {problem}")
    return 1 if problems else 0


def reclaim_disk(say) -> None:  # type: ignore[no-untyped-def]
    """Before any lane: remove what killed runs left on this machine (a persistent CI machine
    keeps it): private engines' data roots no process uses (the real lane's holds ~30 GB), their
    bridges and NAT rules, and the machine engine's dangling images. Caches of earlier runs
    stay (they are what makes a warm run fast); nothing a test of this run made exists yet."""
    from tests.support.dockerd_support import reclaim_stale_bridges, reclaim_stale_engines

    before = disk_line("start")
    removed = reclaim_stale_engines()
    bridges = reclaim_stale_bridges()
    if bridges:
        say(f"removed the bridges and NAT rules of dead private engines: {', '.join(bridges)}")
    dangling = subprocess.run(["docker", "image", "prune", "--force"], capture_output=True,
                              text=True)
    say(f"disk: {before}; removed {len(removed)} dead private engine(s)"
        + (f" ({', '.join(d.name for d in removed)})" if removed else "")
        + f", dangling images: {dangling.stdout.strip().splitlines()[-1:] or ['none']}; "
        + disk_line("end").replace(" at end", " now"))
    usage = subprocess.run(["docker", "system", "df"], capture_output=True, text=True)
    for line in usage.stdout.splitlines():
        say(f"  {line}")


def ci_start() -> float:
    """INFERMATRIX_CI_START (epoch seconds, set by .ci/run) on the monotonic clock."""
    given = os.environ.get("INFERMATRIX_CI_START")
    now = time.monotonic()
    return now - max(0.0, time.time() - float(given)) if given else now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lanes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".state" / "ci",
                        help="JUnit XML, logs and the bases' state (default .state/ci)")
    args = parser.parse_args(argv)
    state = args.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("INFERMATRIX_CI_BUDGET_S", CI_LIMIT_S))
    runner = Runner(phases_of(state), ci_start(), budget)
    reclaim_disk(runner.say)
    try:
        runner.run()
    except KeyboardInterrupt:
        for phase in runner.phases.values():
            if phase.process and phase.process.poll() is None:
                phase.process.send_signal(signal.SIGINT)
        for phase in runner.phases.values():
            if phase.process:
                phase.process.wait()
        return 130
    return report(runner)


if __name__ == "__main__":
    raise SystemExit(main())
