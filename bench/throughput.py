"""Benchmark: total output tokens/s over 1 and 2 replicas and the scaling ratio (figures only).

    python bench/throughput.py [--deployment DIR] [--concurrency 4] [--requests 24]
                               [--max-tokens 32] [--thinking off] [--json FILE]

With --deployment, a running `infermatrix deploy` deployment (its replicas on loopback). Without
it, the CPU lane here: `infermatrix deploy --cpu-lane 2` of the test matrix's vllm-cpu cell,
started and stopped through Compose (tests/support/deploy_support.py: the cell's image, the tiny fixture
model). The load is job/throughput.py's closed loop: `concurrency` requests in flight per
replica, `requests` answers per replica, on 1 replica and then on all of them.

On this machine both replicas share its 2 cores, so the ratio measures the client and the
balancing (requests spread, no replica idle), not the engine's scaling; on a GPU host with one
replica per GPU it is the deployment's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from infermatrix.context import Context, setup_command_log  # noqa: E402
from infermatrix.job import generate, throughput  # noqa: E402

TEST_MATRIX = ROOT / "tests" / "matrix" / "matrix.yaml"


@contextlib.contextmanager
def replicas(deployment: Path | None, work: Path):
    if deployment is not None:
        yield generate.deployment_endpoints(deployment)
        return
    from tests.support.deploy_support import cpu_lane

    ctx = Context.load(TEST_MATRIX, work / "state")
    setup_command_log(ctx.state)
    with cpu_lane(ctx, work, replicas=2, prefix="im18-bench") as (out, _):
        yield generate.deployment_endpoints(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", type=Path, default=None, metavar="DIR")
    parser.add_argument("--concurrency", type=int, default=4, help="in flight per replica")
    parser.add_argument("--requests", type=int, default=24, help="answers per replica")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--thinking", choices=("on", "off"), default="off")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    settings = throughput.LoadSettings(concurrency=[args.concurrency],
                                       thinking=[args.thinking == "on"],
                                       requests=args.requests, max_tokens=args.max_tokens,
                                       max_s=600.0)
    with tempfile.TemporaryDirectory(prefix="im18-bench-") as work, \
            replicas(args.deployment, Path(work)) as endpoints:
        print(f"replicas: {', '.join(f'{e.name} {e.url}' for e in endpoints)}", flush=True)
        waited = throughput.wait_all_healthy(endpoints, 1800)
        print(f"all healthy after {waited:.0f} s", flush=True)
        figures = throughput.measure(endpoints, settings)
    for point in figures["points"]:
        print(f"{point['replicas']} replica(s) x {point['concurrency']} in flight, thinking "
              f"{'on' if point['thinking'] else 'off'}: {point['tokens_per_s']} output tokens/s "
              f"(per replica {point['tokens_per_s_per_replica']}), TTFT p50/p95 "
              f"{point['ttft_ms']['p50']}/{point['ttft_ms']['p95']} ms, ITL p50/p95 "
              f"{point['itl_ms']['p50']}/{point['itl_ms']['p95']} ms, {point['errors']} errors")
    for row in figures["scaling"]:
        print(f"scaling: {row['replicas']} replica(s): {row['tokens_per_s']} output tokens/s")
    print(f"scaling ratio 1 -> {figures['replicas']} replicas: {figures['scaling_ratio']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
