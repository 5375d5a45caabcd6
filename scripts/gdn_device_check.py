#!/usr/bin/env python3
"""The harness's GDN check (src/infermatrix/harness/gpu_ops.py: check_gdn) against the engines'
own Gated DeltaNet Triton kernels, extracted from their wheels by scripts/gdn_engine_kernels.py,
on a GPU host without the engines installed (issue 48).

For each engine folder: gpu_ops.check_gdn(preferred=<engine>, required=True, with_conv=False),
i.e. the harness's own import path resolution, the chunked prefill (2 x 256 and 2 x 16 tokens,
packed, with initial states) and the recurrent decode (4 x 1 token) against the float32
recurrence, the four negative controls run on the kernels; then the same with other seeds; then,
as a demonstration, the kernels fed the state in the [K, V] layout the harness assumed before
(what the check did to vllm 0.33.0 / sglang 0.5.23 before GDN_STATE_LAYOUT). causal conv1d is
not run (its modules are not extracted). Prints one INFERMATRIX-GDN line of JSON per run and a
summary; exit 1 if any run's verdict is not what it must be.

  python3 scripts/gdn_device_check.py [--kernels scripts/gdn_engine_kernels] [--seeds 2 3 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_gpu_ops():
    # the harness module alone (stdlib + torch), as the image runs it: not the infermatrix package
    spec = importlib.util.spec_from_file_location(
        "gpu_ops", REPO / "src" / "infermatrix" / "harness" / "gpu_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(label: str, result: dict) -> list[str]:
    lines = [f"{label}: status {result['status']}"]
    for part, r in result.get("compared", {}).items():
        if "ratio" in r:
            lines.append(f"  {part:20s} rel_rms {r['rel_rms']:.3e} rel_max {r['rel_max']:.3e} "
                         f"(ref RMS {r['ref_rms']:.3e}) ratio {r['ratio']:.3f} -> "
                         f"{r['status']}, margin "
                         f"{1 / r['ratio'] if r['ratio'] else float('inf'):.1f}x")
    for control, c in result.get("negative_controls", {}).items():
        lines.append(f"  control {control:17s} fails by {c['margin']:.1f}x (worst {c['worst']}; "
                     f"needs >= 3) -> {c['status']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=Path, default=REPO / "scripts" / "gdn_engine_kernels")
    parser.add_argument("--engines", nargs="+", default=["vllm-0.33.0", "sglang-0.5.23"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[2, 3, 4])
    args = parser.parse_args(argv)
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name} capability {props.major}.{props.minor} torch {torch.__version__} "
          f"(cuda {torch.version.cuda}) triton {triton.__version__} "
          f"python {sys.version.split()[0]}")
    gpu_ops = load_gpu_ops()
    ok, lines = True, []
    for folder in args.engines:
        try:
            ok &= run_engine(gpu_ops, args, folder, lines)
        except Exception:  # noqa: BLE001 - reported; the other engine still runs
            traceback.print_exc()
            lines.append(f"{folder}: CRASHED (traceback above)")
            ok = False
    print("== summary")
    print("\n".join(lines))
    print("ALL AS EXPECTED" if ok else "NOT AS EXPECTED")
    return 0 if ok else 1


def run_engine(gpu_ops, args, folder: str, lines: list[str]) -> bool:
    ok = True
    engine = folder.split("-")[0]
    sys.path.insert(0, str(args.kernels / folder))
    try:
        print((args.kernels / folder / "SOURCE.txt").read_text().splitlines()[0])
        for seed in args.seeds:
            result = gpu_ops.check_gdn(preferred=engine, required=True, with_conv=False,
                                       seed=seed)
            print("INFERMATRIX-GDN " + json.dumps({"engine": folder, "seed": seed, **result},
                                                  sort_keys=True, default=str))
            lines += summary(f"{folder} seed {seed}", result)
            controls = result.get("negative_controls", {})
            ok &= result["status"] == "pass" and len(controls) == 4 and \
                all(c["margin"] >= 3 for c in controls.values()) and \
                all(r.get("ratio", 1) <= 1 / 3 for r in result["compared"].values())
        # demonstration: the state in the layout the harness assumed before ([K, V])
        saved = dict(gpu_ops.GDN_STATE_LAYOUT)
        gpu_ops.GDN_STATE_LAYOUT.clear()
        old = gpu_ops.check_gdn(preferred=engine, required=True, with_conv=False)
        gpu_ops.GDN_STATE_LAYOUT.update(saved)
        print("INFERMATRIX-GDN " + json.dumps({"engine": folder, "state_layout_forced": "kv",
                                              **old}, sort_keys=True, default=str))
        lines += summary(f"{folder} seed 2, state fed as [K, V] (the old assumption)", old)
        ok &= old["status"] == "fail"
    finally:
        sys.path.remove(str(args.kernels / folder))
        for name in [m for m in sys.modules if m == engine or m.startswith(engine + ".")]:
            del sys.modules[name]
    return ok


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
