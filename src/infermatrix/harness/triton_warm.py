"""A stand-alone tool, run by hand on a GPU host: compile GDN Triton kernels for an arch with
no GPU into a Triton cache directory, then prove that a GPU run of the same workload hits that
cache (zero compiles).

Not a build step: no template, stage or smoke level calls it, and no image the tool builds holds
a Triton cache; the engine compiles its Triton kernels at its first start, as the audit's
"compiled at first start" line says (issue 48). Its one recorded use is docs/h200-gpu-ops.txt
(fla-core's GDN ops for sm_90 on the H200 host: 77 lookups, 77 hits). Why it is not wired into
the images: a hit needs the serve path's own launches (Triton keys its cache on each launch's
specialisation: the integer arguments' divisibility and the constexprs, which follow the
server's batch shapes, not this workload's), and proving one needs a GPU of the cell's arch;
neither is available to the build.

    CUDA_VISIBLE_DEVICES= python3 -m harness.triton_warm --compile-only --arch sm_90 --cache DIR
    python3 -m harness.triton_warm --launch --cache DIR

Both modes drive the same workload (`workload`): a simple Triton kernel (harness/_triton_kernel)
and the Gated DeltaNet ops at Qwen3.6's shapes (chunked prefill, recurrent decode, causal
conv1d) through the implementation harness.gpu_ops picks (the engine's own Triton ops, else
the standalone `fla`).

--compile-only hides every GPU (CUDA_VISIBLE_DEVICES is set empty before torch loads), makes
Triton's active driver a compile-only one for the arch (harness.triton_smem.compile_only: every
launch becomes a compile for GPUTarget("cuda", CC, 32) with the bundled ptxas) and makes
torch.cuda answer as that GPU would (name, capability, shared memory, SM count: launchers and
`fla` read them at import to choose tiles). An autotuned kernel compiles every config its
autotuner keeps after pruning: the runtime benchmarks each of them on first use, so each must be
in the cache. The compiled kernels land in TRITON_CACHE_DIR=DIR.

--launch runs the workload on the GPU with TRITON_CACHE_DIR=DIR and counts, through Triton's
compilation listener, every kernel lookup that hit the cache and every one that compiled. The
result passes only with zero compiles. Triton's small host-side launcher stubs (C, built with
the system compiler once per kernel signature, also cached in DIR) are counted apart: they are
not kernel compiles, but they need a C compiler at first start unless they were cached.
Prints one result line (harness/_result.py); exit 1 on fail.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

try:
    from ._result import emit
    from .triton_smem import compile_only, parse_arch, pretend_cuda
except ImportError:  # pragma: no cover - executed as a plain script
    from _result import emit  # type: ignore[no-redef]
    from triton_smem import compile_only, parse_arch, pretend_cuda  # type: ignore[no-redef]

# What torch.cuda / Triton's driver report for each target (the device's real figures):
# opt-in shared memory per block, SM count, name. Launchers read them to pick tiles.
DEVICES: dict[str, dict[str, Any]] = {
    "sm_90": {"name": "NVIDIA H200", "smem": 232448, "sms": 132, "memory_gib": 141},
    "sm_120": {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "smem": 101376,
               "sms": 188, "memory_gib": 96},
    "sm_121": {"name": "NVIDIA GB10", "smem": 101376, "sms": 48, "memory_gib": 119},
}


class FakeProps:
    def __init__(self, arch: str) -> None:
        facts = DEVICES[arch]
        self.major, self.minor = parse_arch(arch)
        self.name = facts["name"]
        self.multi_processor_count = facts["sms"]
        self.total_memory = facts["memory_gib"] << 30
        self.shared_memory_per_block_optin = facts["smem"]
        self.shared_memory_per_multiprocessor = facts["smem"] + 1024
        self.warp_size = 32
        self.gcnArchName = ""
        self.L2_cache_size = 50 << 20


class FakeUtils:
    """Triton's driver.utils.get_device_properties, as the real device answers it."""

    def __init__(self, arch: str) -> None:
        self.arch = arch

    def get_device_properties(self, device: int = 0) -> dict[str, int]:
        facts = DEVICES[self.arch]
        return {"max_shared_mem": facts["smem"], "multiprocessor_count": facts["sms"],
                "max_num_regs": 65536, "warpSize": 32, "sm_clock_rate": 1980000,
                "mem_clock_rate": 2619000, "mem_bus_width": 5120,
                "max_threads_per_sm": 2048 if parse_arch(self.arch)[0] == 9 else 1536}


# --------------------------------------------------------------------------------------------
# The workload (the same in both modes)
# --------------------------------------------------------------------------------------------

def workload(device: str, shapes: dict[str, int] | None = None) -> list[str]:
    """Launch (or, under compile-only, compile) the kernels; returns the ops driven."""
    import torch

    try:
        from . import gpu_ops
        from ._triton_kernel import triton_add
    except ImportError:  # pragma: no cover
        import gpu_ops  # type: ignore[no-redef]
        from _triton_kernel import triton_add  # type: ignore[no-redef]

    shapes = shapes or gpu_ops.MODEL_SHAPES
    done = []
    x = torch.ones(4099, device=device)
    triton_add(x, x)
    done.append("triton_add")

    impl, tried = gpu_ops.gdn_implementation()
    if impl is None:
        raise RuntimeError("no Gated DeltaNet implementation imports: " + "; ".join(tried))
    h, hv, kd = shapes["gdn_k_heads"], shapes["gdn_v_heads"], shapes["gdn_head_dim"]
    bf16 = torch.bfloat16

    def gdn(b: int, t: int):
        q = torch.randn(1, b * t, h, kd, device=device).to(bf16)
        k = torch.randn(1, b * t, h, kd, device=device).to(bf16)
        v = torch.randn(1, b * t, hv, kd, device=device).to(bf16)
        g = -torch.rand(1, b * t, hv, device=device)
        beta = torch.rand(1, b * t, hv, device=device).to(bf16)
        state = torch.zeros(b, hv, kd, kd, device=device)
        cu = torch.arange(0, b * t + 1, t, dtype=torch.long, device=device)
        return q, k, v, g, beta, state, cu

    q, k, v, g, beta, state, cu = gdn(2, 256)
    gpu_ops.call_known(gpu_ops.resolve(impl["chunk"]), q, k, v, g, beta, scale=kd ** -0.5,
                       initial_state=state, output_final_state=True, cu_seqlens=cu,
                       use_qk_l2norm_in_kernel=True)
    done.append(f"{impl['name']}:chunk_gated_delta_rule")
    q, k, v, g, beta, state, cu = gdn(4, 1)
    gpu_ops.call_known(gpu_ops.resolve(impl["recurrent"]), q, k, v, g=g, beta=beta,
                       scale=kd ** -0.5, initial_state=state, output_final_state=True,
                       inplace_final_state=False, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    done.append(f"{impl['name']}:fused_recurrent_gated_delta_rule")
    if impl["name"] == "fla":
        channels = 2 * h * kd + hv * kd
        xc = torch.randn(2, 100, channels, device=device).to(bf16)
        wc = torch.randn(channels, shapes["conv_width"], device=device).to(bf16)
        gpu_ops.call_known(gpu_ops.resolve(impl["conv"]), xc, weight=wc, bias=None,
                           activation="silu", backend="triton")
        done.append("fla:causal_conv1d")
    if device != "cpu":
        torch.cuda.synchronize()
    return done


# --------------------------------------------------------------------------------------------
# Compile-only
# --------------------------------------------------------------------------------------------

def pretend_device(arch: str) -> None:
    import torch

    pretend_cuda(parse_arch(arch))
    torch.cuda.get_device_properties = lambda device=None: FakeProps(arch)
    torch.cuda.get_device_name = lambda device=None: DEVICES[arch]["name"]


def run_compile_only(arch: str) -> dict[str, Any]:
    import torch

    visible = torch.cuda.device_count()  # before the pretence: the GPUs this process could use
    from triton.runtime import driver

    compiled: list[dict[str, Any]] = []
    pretend_device(arch)
    # an autotuned kernel compiles every config its autotuner keeps (compile_only does that)
    with compile_only(parse_arch(arch), compiled, DEVICES[arch]["smem"]):
        driver.active.utils = FakeUtils(arch)  # the limit and SM count the device reports
        ops = workload("cpu")
    del driver
    kernels = sorted({c["kernel"] for c in compiled})
    errors = [c for c in compiled if c.get("compile_error")]
    return {"status": "pass", "compile_errors": len(errors), "mode": "compile-only", "arch": arch,
            "gpus_visible": visible, "ops": ops, "compiled": len(compiled), "kernels": kernels,
            "configs": compiled}


# --------------------------------------------------------------------------------------------
# Launch, counting compiles
# --------------------------------------------------------------------------------------------

def run_launch() -> dict[str, Any]:
    import torch
    import triton
    from triton import knobs
    from triton.runtime import build

    events: list[dict[str, Any]] = []

    def listener(*, src, metadata, metadata_group, times, cache_hit, **_):
        name = getattr(getattr(src, "fn", None), "__name__", None) or metadata.get("name")
        events.append({"kernel": name, "cache_hit": bool(cache_hit)})

    stubs: list[str] = []
    original_stub = build.compile_module_from_src

    def counting_stub(src, name, *args, **kwargs):
        import hashlib

        key = hashlib.sha256((src + build.platform_key()).encode("utf-8")).hexdigest()
        cached = build.get_cache_manager(key).get_file(
            f"{name}{__import__('sysconfig').get_config_var('EXT_SUFFIX')}") is not None
        stubs.append(f"{name}:{'cached' if cached else 'built'}")
        return original_stub(src, name, *args, **kwargs)

    knobs.compilation.listener = listener
    build.compile_module_from_src = counting_stub
    for mod in list(sys.modules.values()):  # the driver module imported the name directly
        if getattr(mod, "compile_module_from_src", None) is original_stub:
            setattr(mod, "compile_module_from_src", counting_stub)
    cc = torch.cuda.get_device_capability(0)
    ops = workload("cuda")
    compiles = [e["kernel"] for e in events if not e["cache_hit"]]
    hits = [e for e in events if e["cache_hit"]]
    result = {"mode": "launch", "device": torch.cuda.get_device_name(0),
              "capability": f"{cc[0]}.{cc[1]}", "triton": triton.__version__, "ops": ops,
              "lookups": len(events), "cache_hits": len(hits), "recompiles": len(compiles),
              "recompiled": sorted(set(compiles)),
              "launcher_stubs_built": sum(s.endswith(":built") for s in stubs),
              "launcher_stubs_cached": sum(s.endswith(":cached") for s in stubs)}
    if not events:
        return {**result, "status": "fail", "reason": "no Triton kernel was looked up"}
    if compiles:
        return {**result, "status": "fail",
                "reason": f"{len(compiles)} kernel(s) compiled at launch, not found in the cache: "
                          + ", ".join(sorted(set(compiles)))}
    return {**result, "status": "pass"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile-only", action="store_true")
    mode.add_argument("--launch", action="store_true")
    parser.add_argument("--arch", default=None, choices=sorted(DEVICES),
                        help="target of --compile-only")
    parser.add_argument("--cache", required=True, help="the Triton cache directory")
    args = parser.parse_args(argv)
    if args.compile_only and not args.arch:
        parser.error("--compile-only needs --arch")
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(args.cache)
    if args.compile_only:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch loads: no GPU is used
    started = time.monotonic()
    try:
        result = run_compile_only(args.arch) if args.compile_only else run_launch()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        result = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}"[:1000],
                  "traceback_tail": "".join(traceback.format_exception(
                      type(exc), exc, exc.__traceback__)[-4:])[-2000:]}
    result["cache"] = os.environ["TRITON_CACHE_DIR"]
    result["cache_files"] = sum(len(files) for _, _, files in os.walk(args.cache))
    result["duration_s"] = round(time.monotonic() - started, 2)
    return emit({"check": "triton-warm", **result})


if __name__ == "__main__":
    sys.exit(main())
