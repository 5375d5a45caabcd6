"""Benchmark: the audit of one built image, cold then warm (prints figures, asserts nothing).

    python bench/audit_cold_warm.py IMAGE [--target sm_120] [--matrix matrix.yaml]
                                    [--runs 2]

Cold is a fresh state directory (no cuobjdump listing cache, no Triton census cache); each
warm run reuses it, as a re-audit of an unchanged cell does. The audit is the real command
(`infermatrix audit IMAGE --target ARCH --state-dir DIR --no-record`), run as a child process
and timed from outside; its exit code is printed beside the time (a failing audit is still a
figure, and says so). Issue 47's goal for the real vLLM sm_120 cell: warm under 15 s.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def audit_argv(image: str, target: str, matrix: str, state_dir: str) -> list[str]:
    return [sys.executable, "-m", "infermatrix", "audit", image, "--target", target,
            "--matrix", matrix, "--state-dir", state_dir, "--no-record"]


def timed(argv: list[str], log: Path) -> tuple[float, int]:
    """Run `argv` with its output in `log`; (wall seconds, exit code)."""
    print("$", shlex.join(argv), flush=True)
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    return time.monotonic() - started, rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", help="an image reference (labelled io.infermatrix.cell)")
    parser.add_argument("--target", default="sm_120")
    parser.add_argument("--matrix", default=str(ROOT / "matrix.yaml"))
    parser.add_argument("--runs", type=int, default=2, help="warm runs after the cold one")
    args = parser.parse_args()
    if not args.image:  # `nox -s bench` runs every script without arguments
        print("audit_cold_warm: no IMAGE given, nothing measured (e.g. `python "
              "bench/audit_cold_warm.py infermatrix-local/CELL:build --target sm_120`)")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as state_dir:
        figures: list[tuple[str, float, int]] = []
        for i in range(1 + args.runs):
            label = "cold" if i == 0 else f"warm {i}"
            log = Path(state_dir) / f"audit-{i}.log"
            seconds, rc = timed(audit_argv(args.image, args.target, args.matrix, state_dir), log)
            figures.append((label, seconds, rc))
            print(f"{label:8s} {seconds:8.1f} s  exit {rc}  (log {log})", flush=True)
            if rc not in (0, 1):  # 0 pass, 1 a failed check: both are an audit that ran
                print(log.read_text(encoding="utf-8")[-3000:])
                return rc
        cold = figures[0][1]
        best_warm = min(s for _, s, _ in figures[1:]) if args.runs else float("nan")
        print(f"audit {args.image} ({args.target}): cold {cold:.1f} s, warm {best_warm:.1f} s, "
              f"warm/cold {best_warm / cold:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
