"""Triton shared memory without a GPU: compile the engine's own attention kernels for an arch.

    python3 -m harness.triton_smem --engine sglang --backend triton --arch sm_120=101376 \\
        --arch sm_121=101376 --head-dim 256 --q-heads 24 --kv-heads 4 --vision-head-dim 72

For each arch (one fresh interpreter each, so the engine's modules see that capability at
import), the engine's own launcher functions run with small CPU tensors while:
- torch.cuda reports the arch's compute capability (the launchers pick BLOCK sizes, warps and
  stages from it);
- Triton's active driver is a compile-only one whose target is GPUTarget("cuda", CC, 32), and
  every JIT launch is turned into a warm-up: the kernel is compiled (bundled ptxas, no GPU)
  and not launched.
Each compiled kernel's `metadata.shared` (bytes of shared memory per block; what the driver
compares at first launch: "out of resource: shared memory, Required: N, Hardware limit: L") is
compared with the arch's limit given on the command line (the host keeps the limits as data).
A launcher that cannot be driven (its signature or imports changed) is reported as such, with
the error: the result is then `skip` for it, never a silent pass. Prints one result line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

try:
    from ._result import emit, parse
except ImportError:  # pragma: no cover - executed as a plain script
    from _result import emit, parse  # type: ignore[no-redef]

SM_COUNT = 188  # RTX PRO 6000 Blackwell; only split heuristics read it, never block sizes


def parse_arch(text: str) -> tuple[int, int]:
    digits = text.lower().removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


# --------------------------------------------------------------------------------------------
# Compile instead of launch
# --------------------------------------------------------------------------------------------

class CompileOnlyDriver:
    """The part of Triton's driver interface a JIT launch uses, for a GPU that is not here."""

    def __init__(self, cc: tuple[int, int]) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", cc[0] * 10 + cc[1], 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_device_interface(self):
        import torch

        return torch.cuda

    def get_benchmarker(self):
        raise RuntimeError("autotuning benchmarks need a GPU")

    @staticmethod
    def is_active() -> bool:
        return True


def kernel_record(fn: Any, kernel: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    meta = kernel.metadata
    blocks = {k: v for k, v in kwargs.items()
              if isinstance(v, (int, bool)) and (k.isupper() or k.startswith("BLOCK"))}
    return {"kernel": getattr(fn, "__name__", None) or fn.fn.__name__,
            "module": getattr(fn, "__module__", None), "shared": int(meta.shared),
            "num_warps": int(meta.num_warps), "num_stages": int(meta.num_stages),
            "constexprs": blocks}


@contextlib.contextmanager
def compile_only(cc: tuple[int, int], compiled: list[dict[str, Any]]) -> Iterator[None]:
    """Every Triton JIT launch compiles for `cc` and records the kernel instead of running."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        self.device_caches.clear()  # a binder made for another target must not be reused
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            compiled.append(kernel_record(self, kernel, kwargs))
        return kernel

    driver.set_active(CompileOnlyDriver(cc))
    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original
        driver.reset_active() if driver._default is not None else None


class _Props:
    def __init__(self, cc: tuple[int, int]) -> None:
        self.major, self.minor = cc
        self.name = f"compile-only sm_{cc[0]}{cc[1]}"
        self.multi_processor_count = SM_COUNT
        self.total_memory = 96 << 30
        self.shared_memory_per_block_optin = 0  # unknown here: the host compares the limit
        self.warp_size = 32


def pretend_cuda(cc: tuple[int, int]) -> None:
    """torch.cuda answers as a device of `cc` would, for the launchers' capability checks."""
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: cc
    torch.cuda.get_device_properties = lambda device=None: _Props(cc)
    torch.cuda.get_device_name = lambda device=None: _Props(cc).name
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1


# --------------------------------------------------------------------------------------------
# Driving a launcher: arguments by name
# --------------------------------------------------------------------------------------------

def call_by_name(fn: Callable[..., Any], bank: dict[str, Any]) -> None:
    """Call `fn` with the arguments of `bank` its signature names; a required parameter the
    bank does not know means the launcher changed: raise so it is reported as not driven."""
    parameters = inspect.signature(fn).parameters
    missing = [n for n, p in parameters.items()
               if p.default is inspect.Parameter.empty and n not in bank
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise TypeError(f"{fn.__module__}.{fn.__name__} takes {', '.join(missing)}, which this "
                        "harness does not know how to fill")
    fn(**{n: bank[n] for n in parameters if n in bank})


def sglang_banks(shape: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Arguments for SGLang's triton-backend launchers, in bf16: the text model's full attention
    as one sequence of 64 new tokens after a 64-token prefix (extend) and one decode step; and
    the vision encoder's non-causal attention over 64 patches (prefill: `context_attention_fwd`
    is what SGLang's default `triton_attn` multimodal backend calls on SM 12.x)."""
    import torch

    head_dim, q_heads, kv_heads = shape["head_dim"], shape["q_heads"], shape["kv_heads"]
    vision_dim, vision_heads = shape["vision_head_dim"], shape["vision_heads"]

    bf16, i32 = torch.bfloat16, torch.int32
    extend, prefix, tokens = 64, 64, 128
    q = torch.zeros(extend, q_heads, head_dim, dtype=bf16)
    kv = torch.zeros(extend, kv_heads, head_dim, dtype=bf16)
    k_buffer = torch.zeros(tokens, kv_heads, head_dim, dtype=bf16)
    splits = 8
    common = {"k_buffer": k_buffer, "v_buffer": k_buffer.clone(), "sm_scale": 1 / math.sqrt(head_dim),
              "k_scale": 1.0, "v_scale": 1.0, "logit_cap": 0.0}
    return {
        "extend": {**common, "q_extend": q, "k_extend": kv, "v_extend": kv.clone(),
                   "o_extend": torch.zeros_like(q), "qo_indptr": torch.tensor([0, extend], dtype=i32),
                   "kv_indptr": torch.tensor([0, prefix], dtype=i32),
                   "kv_indices": torch.arange(prefix, dtype=i32), "custom_mask": None,
                   "is_causal": True, "mask_indptr": torch.zeros(2, dtype=torch.int64),
                   "max_len_extend": extend},
        "decode": {**common, "q": torch.zeros(1, q_heads, head_dim, dtype=bf16),
                   "o": torch.zeros(1, q_heads, head_dim, dtype=bf16),
                   "kv_indptr": torch.tensor([0, tokens], dtype=i32),
                   "kv_indices": torch.arange(tokens, dtype=i32),
                   "attn_logits": torch.zeros(1, q_heads, splits, head_dim, dtype=torch.float32),
                   "attn_lse": torch.zeros(1, q_heads, splits, dtype=torch.float32),
                   "num_kv_splits": torch.full((1,), splits, dtype=i32),
                   "max_kv_splits": splits},
        "prefill": {**{n: torch.zeros(extend, vision_heads, vision_dim, dtype=bf16)
                       for n in ("q", "k", "v", "o")},
                    "b_start_loc": torch.tensor([0], dtype=i32),
                    "b_seq_len": torch.tensor([extend], dtype=i32), "max_input_len": extend,
                    "is_causal": False, "sm_scale": 1 / math.sqrt(vision_dim)},
    }


# (kernel family, module, launcher) per engine backend; the first importable module wins
SGLANG_TRITON = [
    ("extend", ["sglang.kernels.ops.attention.extend_attention",
                "sglang.srt.layers.attention.triton_ops.extend_attention"], "extend_attention_fwd"),
    ("decode", ["sglang.kernels.ops.attention.decode_attention",
                "sglang.srt.layers.attention.triton_ops.decode_attention"], "decode_attention_fwd"),
    ("prefill", ["sglang.kernels.ops.attention.prefill_attention",
                 "sglang.srt.layers.attention.triton_ops.prefill_attention"],
     "context_attention_fwd"),
]


def import_first(names: list[str]) -> Any:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and not name.startswith(exc.name):
                raise  # the module exists but one of its imports is missing: a real error
            errors.append(f"{name}: {exc}")
    raise ModuleNotFoundError("; ".join(errors))


def drive_sglang(cc: tuple[int, int], shape: dict[str, int]) -> list[dict[str, Any]]:
    pretend_cuda(cc)
    banks = sglang_banks(shape)
    return [drive_one(family, lambda m=modules, f=fn, b=banks[family]: call_by_name(
        getattr(import_first(m), f), b), cc) for family, modules, fn in SGLANG_TRITON]


def vllm_banks(cc: tuple[int, int], head_dim: int, q_heads: int, kv_heads: int,
               block_size: int = 16) -> dict[str, dict[str, Any]]:
    """Arguments for vLLM's unified Triton attention over a paged bf16 KV cache: a 64-token
    prefill (2D kernel) and a 4-sequence decode with the split-KV scratch its TRITON_ATTN
    backend allocates (3D kernel + segment reduction; 64 segments on 12.0, else 16, as
    vllm/v1/attention/backends/triton_attn.py sets them)."""
    import torch

    bf16, i32, f32 = torch.bfloat16, torch.int32, torch.float32
    blocks = 16
    cache = torch.zeros(blocks, block_size, kv_heads, head_dim, dtype=bf16)
    try:
        from vllm.v1.attention.backends.triton_attn import MIN_LAUNCH_GRID_SIZE_2D
    except ImportError:
        MIN_LAUNCH_GRID_SIZE_2D = 128
    segments = 64 if cc == (12, 0) else 16
    padded = 1 << (head_dim - 1).bit_length()

    def bank(seqs: int, q_len: int, kv_len: int) -> dict[str, Any]:
        q = torch.zeros(seqs * q_len, q_heads, head_dim, dtype=bf16)
        return {"q": q, "k": cache, "v": cache.clone(), "out": torch.zeros_like(q),
                "cu_seqlens_q": torch.arange(0, seqs * q_len + 1, q_len, dtype=i32),
                "max_seqlen_q": q_len, "seqused_k": torch.full((seqs,), kv_len, dtype=i32),
                "max_seqlen_k": kv_len, "softmax_scale": 1 / math.sqrt(head_dim),
                "causal": True, "window_size": (-1, -1),
                "block_table": torch.arange(seqs * 4, dtype=i32).reshape(seqs, 4) % blocks,
                "softcap": 0.0, "q_descale": None, "k_descale": None, "v_descale": None,
                "alibi_slopes": None, "sinks": None,
                "seq_threshold_3D": MIN_LAUNCH_GRID_SIZE_2D // kv_heads,
                "num_par_softmax_segments": segments,
                "softmax_segm_output": torch.zeros(seqs * q_len, q_heads, segments, padded,
                                                   dtype=f32),
                "softmax_segm_max": torch.zeros(seqs * q_len, q_heads, segments, dtype=f32),
                "softmax_segm_expsum": torch.zeros(seqs * q_len, q_heads, segments, dtype=f32)}
    return {"prefill": bank(1, 64, 64), "decode": bank(4, 1, 64)}


VLLM_TRITON = [("unified", ["vllm.v1.attention.ops.triton_unified_attention",
                            "vllm.attention.ops.triton_unified_attention"], "unified_attention")]


def pretend_vllm_platform(cc: tuple[int, int]) -> None:
    """vLLM's current_platform as a CUDA device of `cc` (its CUDA platform module needs the
    driver library, which a GPU-less host lacks)."""
    from vllm import platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class CompileOnlyCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*cc)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return _Props(cc).name

    platforms._current_platform = CompileOnlyCuda()


def drive_vllm(cc: tuple[int, int], shape: dict[str, int]) -> list[dict[str, Any]]:
    pretend_cuda(cc)
    results = []
    try:
        pretend_vllm_platform(cc)
    except Exception as exc:  # noqa: BLE001 - reported as not driven
        return [not_driven("unified", exc)]
    banks = vllm_banks(cc, shape["head_dim"], shape["q_heads"], shape["kv_heads"])
    for family, modules, fn in VLLM_TRITON:
        for case, bank in banks.items():
            results.append(drive_one(f"{family}-{case}", lambda m=modules, f=fn, b=bank:
                                     call_by_name(getattr(import_first(m), f), b), cc))
    return results


def drive_fixture(cc: tuple[int, int], shape: dict[str, int], path: str) -> list[dict[str, Any]]:
    """A kernel file with `drive(cc, shape)` (tests): its launcher picks blocks by capability."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("triton_smem_fixture", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # triton.jit reads the source through the module
    spec.loader.exec_module(module)
    return [drive_one("fixture", lambda: module.drive(cc, shape), cc)]


def not_driven(family: str, exc: BaseException) -> dict[str, Any]:
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
    return {"family": family, "driven": False, "reason": f"{type(exc).__name__}: {exc}"[:600],
            "traceback_tail": tail[-1500:], "kernels": []}


def drive_one(family: str, call: Callable[[], Any], cc: tuple[int, int]) -> dict[str, Any]:
    compiled: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        with compile_only(cc, compiled):
            call()
    except Exception as exc:  # noqa: BLE001 - the launcher could not be driven: say so
        if not compiled:
            return not_driven(family, exc)
        # kernels compiled before the launcher failed on a later CPU-side step still count
        return {"family": family, "driven": True, "kernels": compiled,
                "note": f"launcher stopped after compiling: {type(exc).__name__}: {exc}"[:400],
                "duration_s": round(time.monotonic() - started, 2)}
    if not compiled:
        return {"family": family, "driven": False, "kernels": [],
                "reason": "the launcher ran but compiled no Triton kernel"}
    return {"family": family, "driven": True, "kernels": compiled,
            "duration_s": round(time.monotonic() - started, 2)}


DRIVERS = {"sglang": drive_sglang, "vllm": drive_vllm}


# --------------------------------------------------------------------------------------------
# Verdict
# --------------------------------------------------------------------------------------------

def judge(arch: str, limit: int, families: list[dict[str, Any]]) -> dict[str, Any]:
    over, undriven = [], []
    for family in families:
        if not family.get("driven"):
            undriven.append(f"{family['family']}: {family.get('reason')}")
        for kernel in family.get("kernels", []):
            kernel["limit"] = limit
            kernel["fits"] = kernel["shared"] <= limit
            if not kernel["fits"]:
                over.append(f"{kernel['kernel']} ({family['family']}) needs {kernel['shared']} "
                            f"bytes of shared memory per block on {arch}; the limit is {limit} "
                            f"(warps {kernel['num_warps']}, stages {kernel['num_stages']}, "
                            f"{json.dumps(kernel['constexprs'], sort_keys=True)})")
    status = "fail" if over else "skip" if undriven else "pass"
    reason = "; ".join(over) if over else \
        ("kernels not driven, so not checked: " + "; ".join(undriven)) if undriven else None
    return {"arch": arch, "limit": limit, "status": status, "reason": reason,
            "families": families}


def one_arch(args: argparse.Namespace) -> int:
    arch, limit = args.one_arch.split("=")
    cc = parse_arch(arch)
    shape = {"head_dim": args.head_dim, "q_heads": args.q_heads, "kv_heads": args.kv_heads,
             "vision_head_dim": args.vision_head_dim, "vision_heads": args.vision_heads}
    try:
        families = drive_fixture(cc, shape, args.fixture) if args.fixture \
            else DRIVERS[args.engine](cc, shape)
    except Exception as exc:  # noqa: BLE001
        families = [not_driven(args.engine, exc)]
    return emit({"check": "triton-smem", **judge(arch, int(limit), families)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(DRIVERS), default="sglang")
    parser.add_argument("--backend", default="triton", help="the cell's attention backend")
    parser.add_argument("--arch", action="append", default=[], metavar="SM=BYTES",
                        help="target arch and its shared memory limit per block, e.g. sm_120=101376")
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--q-heads", type=int, default=24)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vision-head-dim", type=int, default=72)
    parser.add_argument("--vision-heads", type=int, default=16)
    parser.add_argument("--fixture", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one-arch", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.one_arch:
        return one_arch(args)
    started = time.monotonic()
    results = [run_arch(args, spec, argv or sys.argv[1:]) for spec in args.arch]
    statuses = {r["status"] for r in results}
    status = "fail" if "fail" in statuses else "skip" if "skip" in statuses or not results \
        else "pass"
    reasons = [f"{r['arch']}: {r['reason']}" for r in results if r.get("reason")]
    return emit({"check": "triton-smem", "status": status, "engine": args.engine,
                 "backend": args.backend, "reason": "; ".join(reasons) or
                 (None if results else "no --arch given"),
                 "head_dim": args.head_dim, "archs": results,
                 "duration_s": round(time.monotonic() - started, 2)})


def run_arch(args: argparse.Namespace, spec: str, argv: list[str]) -> dict[str, Any]:
    """One fresh interpreter per arch: the engine modules read the capability at import."""
    arch = spec.split("=")[0]
    rest = [a for i, a in enumerate(argv) if a != "--arch" and (i == 0 or argv[i - 1] != "--arch")]
    command = [sys.executable, "-m", __spec__.name if __spec__ else "harness.triton_smem",
               *rest, "--one-arch", spec]
    env = dict(os.environ, TRITON_CACHE_DIR=os.environ.get("TRITON_CACHE_DIR",
                                                           "/tmp/infermatrix-triton-cache"))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"arch": arch, "status": "fail", "reason": f"timed out after {args.timeout} s"}
    parsed = parse(done.stdout)
    if parsed is None:
        return {"arch": arch, "status": "fail", "crashed": True, "exit": done.returncode,
                "reason": f"no result (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout)[-1500:]}"}
    parsed.pop("check", None)
    return parsed


if __name__ == "__main__":
    sys.exit(main())
