"""Benchmark: the audit probe of an image whose programs run emulated here, run by this
machine's Python inside the image's container vs the image's own python3 under QEMU, side by
side in one run (prints figures, asserts nothing).

    python bench/audit_probe_native.py [IMAGE ...] [--digests DIST ...] [--rounds N]

Default image: the real matrix's arm64 base (built when missing: debootstrap under QEMU,
minutes). A real GB10 cell image (`infermatrix-local/cu130-...-sm121:build`) is the case the
native probe is for: name it. Each round runs both ways; the figures are per way and the ratio
emulated / native of their medians. The facts both ways found are compared too (pip check
apart, which only the native way can run in an image without its own pip or uv).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix.config import load_matrix  # noqa: E402
from infermatrix.engine.docker import Engine  # noqa: E402
from infermatrix.stages import audit, base  # noqa: E402
from infermatrix.state import StatePaths  # noqa: E402


def default_image() -> str:
    with tempfile.TemporaryDirectory() as state:
        return base.build_base(load_matrix(ROOT / "tests" / "real" / "matrix.yaml"), "bookworm",
                               StatePaths.at(Path(state)), platform="linux/arm64",
                               docker=Engine()).ref


def timed(image: str, digests: list[str], native: audit.NativePython | None
          ) -> tuple[float, dict]:
    started = time.monotonic()
    code, output = audit._run_probe(image, digests, audit.PROBE_TIMEOUT_S, native, Engine())
    seconds = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"{image}: the probe ({'native' if native else 'emulated'}) exited "
                         f"{code}:\n{output[-2000:]}")
    return seconds, audit.parse_probe_output(output)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*")
    parser.add_argument("--digests", nargs="*", default=[],
                        help="distributions whose .py files the probe hashes (the twin check)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    native = audit.native_python()
    if native is None:
        raise SystemExit("this Python cannot run inside a container (not a dynamic ELF program)")
    for image in args.images or [default_image()]:
        emulated = Engine().emulation_of(image)
        if not emulated:
            print(f"{image}: runs natively here, nothing to compare")
            continue
        fast, slow = [], []
        for _ in range(args.rounds):
            seconds, native_facts = timed(image, args.digests, native)
            fast.append(seconds)
            seconds, emulated_facts = timed(image, args.digests, None)
            slow.append(seconds)
        same = {k: v for k, v in native_facts.items() if k != "pip_check"} == \
            {k: v for k, v in emulated_facts.items() if k != "pip_check"}
        print(f"{image} ({emulated}): {len(native_facts['objects'])} shared objects, "
              f"{sum(o.get('size', 0) for o in native_facts['objects']) / 2**20:.0f} MiB")
        print(f"  native   {statistics.median(fast):7.1f} s  (rounds {', '.join(f'{s:.1f}' for s in fast)})")
        print(f"  emulated {statistics.median(slow):7.1f} s  (rounds {', '.join(f'{s:.1f}' for s in slow)})")
        print(f"  emulated / native: {statistics.median(slow) / statistics.median(fast):.1f}x; "
              f"same facts: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
