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
import functools
import importlib
import inspect
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Optional

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

class _CompileOnlyUtils:
    """`driver.active.utils` as far as kernels query it at import: the target's real limit.
    FLA's `check_shared_mem()` (vLLM's and SGLang's GDN ops) picks its tile lists from
    `get_device_properties(i)["max_shared_mem"]`; a wrong answer gives other tiles."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def get_device_properties(self, device: int = 0) -> dict[str, int]:
        return {"max_shared_mem": self.limit, "multiprocessor_count": SM_COUNT,
                "max_num_regs": 65536, "warpSize": 32, "sm_clock_rate": 0,
                "mem_clock_rate": 0, "mem_bus_width": 0}


class CompileOnlyDriver:
    """The part of Triton's driver interface a JIT launch uses, for a GPU that is not here."""

    def __init__(self, cc: tuple[int, int], limit: int = 0) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", cc[0] * 10 + cc[1], 32)
        self.utils = _CompileOnlyUtils(limit)

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


def jit_function_of(fn: Any) -> Any:
    """The JITFunction under an Autotuner / Heuristics chain."""
    while hasattr(fn, "fn") and not hasattr(fn, "device_caches"):
        fn = fn.fn
    return fn


@contextlib.contextmanager
def compile_only(cc: tuple[int, int], compiled: list[dict[str, Any]],
                 limit: int = 0) -> Iterator[None]:
    """Every Triton JIT launch compiles for `cc` and records the kernel instead of running.
    An autotuned launch compiles every config the autotuner would benchmark (after its own
    pruning), as the runtime does at first start: each record carries its autotune group, so
    the verdict can honour the runtime's skipping of configs that run out of resources."""
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    original = JITFunction.run
    original_tune = Autotuner.run
    group: list[dict[str, Any] | None] = [None]

    def run(self, *args, grid, warmup, **kwargs):
        self.device_caches.clear()  # a binder made for another target must not be reused
        started = time.monotonic()
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            record = kernel_record(self, kernel, kwargs)
            record["compile_s"] = round(time.monotonic() - started, 3)
            if group[0] is not None:
                record["autotune"] = group[0]["id"]
                record["configs"] = group[0]["configs"]
            compiled.append(record)
        return kernel

    def tuned(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
        except Exception:  # noqa: BLE001 - a pruning hook that needs a GPU: take every config
            configs = self.configs
        outer = group[0]
        current: dict[str, Any] = {"id": f"{jit_function_of(self).__name__}#{len(compiled)}",
                                   "configs": len(configs)}
        group[0] = current
        try:
            for config in configs:
                try:
                    self.fn.run(*args, **kwargs, **config.all_kwargs())
                except Exception as exc:  # noqa: BLE001 - the runtime skips such a config too
                    compiled.append({"kernel": jit_function_of(self).__name__,
                                     "autotune": current["id"], "configs": len(configs),
                                     "compile_error": f"{type(exc).__name__}: {exc}"[:300],
                                     "constexprs": dict(config.kwargs),
                                     "num_warps": config.num_warps,
                                     "num_stages": config.num_stages})
        finally:
            group[0] = outer
            self.nargs = None

    driver.set_active(CompileOnlyDriver(cc, limit))
    JITFunction.run = run
    Autotuner.run = tuned
    DRIVER_ACTIVE[0] += 1
    try:
        yield
    finally:
        DRIVER_ACTIVE[0] -= 1
        JITFunction.run = original
        Autotuner.run = original_tune
        driver.reset_active() if driver._default is not None else None


# How many compile_only contexts are open, and, per FLA chunk_o module name, whether one was
# open when that module was first imported (its tile list is chosen by that import).
DRIVER_ACTIVE = [0]
IMPORTED_UNDER_DRIVER: dict[str, bool] = {}


class ChunkOImportWatch:
    """A meta path finder that finds nothing: it notes, for each `*.chunk_o` module, whether
    the compile-only driver was active when it was imported. Installed first thing in the
    per-arch interpreter, before any engine module loads."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.endswith(".chunk_o"):
            IMPORTED_UNDER_DRIVER.setdefault(name, DRIVER_ACTIVE[0] > 0)
        return None


def watch_chunk_o_imports() -> None:
    if not any(isinstance(f, ChunkOImportWatch) for f in sys.meta_path):
        sys.meta_path.insert(0, ChunkOImportWatch())


class _Props:
    def __init__(self, cc: tuple[int, int], limit: int = 0) -> None:
        self.major, self.minor = cc
        self.name = f"compile-only sm_{cc[0]}{cc[1]}"
        self.multi_processor_count = SM_COUNT
        self.total_memory = 96 << 30
        # what an import-time query of the limit must see: the target's, never this host's
        self.shared_memory_per_block_optin = limit
        self.warp_size = 32


def pretend_cuda(cc: tuple[int, int], limit: int = 0) -> None:
    """torch.cuda answers as a device of `cc` would, for the launchers' capability checks."""
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: cc
    torch.cuda.get_device_properties = lambda device=None: _Props(cc, limit)
    torch.cuda.get_device_name = lambda device=None: _Props(cc).name
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "device_index"):
        # FLA's input_guard enters the tensor's device; CPU tensors have none to enter
        accelerator.device_index = lambda index=None: contextlib.nullcontext()
    # SGLang's FLA input_guard enters torch.cuda.device(tensor.device.index) and its gated
    # norm enters the tensor's device module's `device` (torch.cpu here): no device to enter
    torch.cuda.device = lambda index=None: contextlib.nullcontext()
    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()


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


def call_first(modules: list[str], fn: str, bank: dict[str, Any]) -> None:
    """`fn` of the first of `modules` that imports, called with `bank`'s arguments."""
    call_by_name(getattr(import_first(modules), fn), bank)


def drive_sglang(cc: tuple[int, int], shape: dict[str, int], limit: int = 0
                 ) -> list[dict[str, Any]]:
    pretend_cuda(cc, limit)
    banks = sglang_banks(shape)
    results = [drive_one(family, functools.partial(call_first, modules, fn, banks[family]), cc,
                         limit) for family, modules, fn in SGLANG_TRITON]
    if shape.get("gdn_key_heads"):
        results += [drive_one(family, call, cc, limit)
                    for family, call in sglang_gdn_calls(shape)]
        attach_tile_choice(results, SGLANG_FLA, cc, limit)
    return results


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

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return SM_COUNT

        @classmethod
        def get_cuda_runtime_major(cls) -> int:
            # the image's torch CUDA runtime, as vllm.platforms.cuda reads it
            import torch

            return int((torch.version.cuda or "0").split(".")[0])

    platforms._current_platform = CompileOnlyCuda()
    try:  # host-to-device copies in launchers (FLA's chunk indices): the tensors stay on CPU
        from vllm.utils import torch_utils

        def to_host_tensor(data, device=None, dtype=None, out=None, **_ignored):
            import torch

            tensor = torch.as_tensor(data, dtype=dtype if dtype is not None else
                                     (out.dtype if out is not None else None))
            return out.copy_(tensor) if out is not None else tensor

        torch_utils.async_tensor_h2d = to_host_tensor
    except (ImportError, AttributeError):
        pass


def drive_vllm(cc: tuple[int, int], shape: dict[str, int], limit: int = 0
               ) -> list[dict[str, Any]]:
    pretend_cuda(cc, limit)
    results = []
    try:
        pretend_vllm_platform(cc)
    except Exception as exc:  # noqa: BLE001 - reported as not driven
        return [not_driven("unified", exc)]
    banks = vllm_banks(cc, shape["head_dim"], shape["q_heads"], shape["kv_heads"])
    for family, modules, fn in VLLM_TRITON:
        for case, bank in banks.items():
            results.append(drive_one(f"{family}-{case}",
                                     functools.partial(call_first, modules, fn, bank), cc, limit))
    if shape.get("gdn_key_heads"):
        results += [drive_one(family, call, cc, limit) for family, call in vllm_gdn_calls(shape)]
        attach_tile_choice(results, VLLM_FLA, cc, limit)
    return results


def fla_tile_choice(modules: list[str], cc: tuple[int, int], limit: int) -> dict[str, Any]:
    """What the engine's FLA `chunk_o` chose at import: its tile list (BKV_LIST, from
    `utils.check_shared_mem()`, cached at that import), its warp list, the threshold it
    compares with (`utils.Backend.DEFAULT`), and the limit the same query sees here under the
    compile-only driver (-1 there would mean the query failed and the small tiles were taken
    by default, not by the target's limit), and whether its import ran under that driver
    (ChunkOImportWatch; then the limit seen here is the one its import saw)."""
    try:
        base = import_first(modules).__name__
        chunk_o = importlib.import_module(f"{base}.chunk_o")
        utils = importlib.import_module(f"{base}.utils")
        with compile_only(cc, [], limit):
            seen = list(utils.get_all_max_shared_mem())
        return {"module": chunk_o.__name__, "BKV_LIST": list(chunk_o.BKV_LIST),
                "imported_under_driver": IMPORTED_UNDER_DRIVER.get(chunk_o.__name__),
                "NUM_WARPS": list(getattr(chunk_o, "NUM_WARPS", [])),
                "large_smem": bool(utils.check_shared_mem()),
                "threshold": int(utils.Backend.DEFAULT.value), "limit_seen": seen}
    except Exception as exc:  # noqa: BLE001 - reported, and the host's check fails on it
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}


def attach_tile_choice(results: list[dict[str, Any]], modules: list[str], cc: tuple[int, int],
                       limit: int) -> None:
    """The chunked-prefill family carries its chunk_o's import-time tile choice."""
    for family in results:
        if family["family"] == "gdn-prefill-chunk":
            family["tiles"] = fla_tile_choice(modules, cc, limit)


# --------------------------------------------------------------------------------------------
# Gated DeltaNet (linear attention) and its neighbours: the Triton ops of 48 of Qwen3.6's 64
# layers, from vLLM's own copy of FLA (vllm.third_party.flash_linear_attention, older releases
# vllm.model_executor.layers.fla) and its causal conv1d
# --------------------------------------------------------------------------------------------

VLLM_FLA = ["vllm.third_party.flash_linear_attention.ops",
            "vllm.model_executor.layers.fla.ops"]
VLLM_CONV = ["vllm.model_executor.layers.mamba.ops.causal_conv1d"]


def engine_op(modules: list[str], dotted: str) -> Any:
    """`dotted` ("name" or "submodule.name") under the first of `modules` that imports."""
    module_name, _, name = dotted.rpartition(".")
    base = import_first(modules).__name__
    return getattr(importlib.import_module(f"{base}.{module_name}" if module_name else base),
                   name)


def vllm_gdn_calls(shape: dict[str, int]) -> list[tuple[str, Callable[[], Any]]]:
    """(family, call) of every GDN-layer Triton op vLLM's Qwen3.5/3.6 GDN layer launches, at
    the model's shapes (TP 1): a 64-token prefill of one sequence and a 4-sequence decode, as
    vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py (0.33.0) calls them: the chunk
    op on the output of fused_post_conv_prep (q, k already L2-normed: no in-kernel L2 norm), a
    decode-only batch through the packed recurrent decode, and the decode rows of a batch that
    also holds a prefill (or an MTP draft) through fused_sigmoid_gating_delta_rule_update."""
    import torch

    hk, hv, d, width = (shape["gdn_key_heads"], shape["gdn_value_heads"], shape["gdn_head_dim"],
                        shape["gdn_conv_width"])
    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    tokens, seqs = 64, 4
    conv_dim = 2 * hk * d + hv * d
    cu = torch.tensor([0, tokens], dtype=torch.int64)

    def chunk() -> Any:
        return engine_op(VLLM_FLA, "chunk_gated_delta_rule")(
            q=torch.zeros(1, tokens, hk, d, dtype=bf16), k=torch.zeros(1, tokens, hk, d, dtype=bf16),
            v=torch.zeros(1, tokens, hv, d, dtype=bf16), g=torch.zeros(1, tokens, hv, dtype=f32),
            beta=torch.zeros(1, tokens, hv, dtype=bf16),
            initial_state=torch.zeros(1, hv, d, d, dtype=f32), output_final_state=True,
            cu_seqlens=cu, use_qk_l2norm_in_kernel=False)  # q, k come L2-normed from prep

    def prep() -> Any:
        return engine_op(VLLM_FLA, "fused_post_conv_prep")(
            conv_output=torch.zeros(tokens, conv_dim, dtype=bf16),
            a=torch.zeros(tokens, hv, dtype=bf16), b=torch.zeros(tokens, hv, dtype=bf16),
            A_log=torch.zeros(hv, dtype=f32), dt_bias=torch.zeros(hv, dtype=f32),
            num_k_heads=hk, head_k_dim=d, head_v_dim=d, apply_l2norm=True, output_g_exp=False)

    def decode() -> Any:
        return engine_op(VLLM_FLA, "fused_recurrent_gated_delta_rule_packed_decode")(
            mixed_qkv=torch.zeros(seqs, conv_dim, dtype=bf16),
            a=torch.zeros(seqs, hv, dtype=bf16), b=torch.zeros(seqs, hv, dtype=bf16),
            A_log=torch.zeros(hv, dtype=f32), dt_bias=torch.zeros(hv, dtype=f32),
            scale=d ** -0.5, initial_state=torch.zeros(seqs + 1, hv, d, d, dtype=f32),
            out=torch.zeros(seqs, 1, hv, d, dtype=bf16),
            ssm_state_indices=torch.arange(seqs, dtype=i32), use_qk_l2norm_in_kernel=True)

    def mixed_decode() -> Any:  # the decode rows of a batch that also holds a prefill
        return engine_op(VLLM_FLA, "fused_sigmoid_gating_delta_rule_update")(
            A_log=torch.zeros(hv, dtype=f32), a=torch.zeros(seqs, hv, dtype=bf16),
            b=torch.zeros(seqs, hv, dtype=bf16), dt_bias=torch.zeros(hv, dtype=f32),
            q=torch.zeros(1, seqs, hk, d, dtype=bf16), k=torch.zeros(1, seqs, hk, d, dtype=bf16),
            v=torch.zeros(1, seqs, hv, d, dtype=bf16),
            initial_state=torch.zeros(seqs + 1, hv, d, d, dtype=f32), inplace_final_state=True,
            cu_seqlens=torch.arange(seqs + 1, dtype=i32),
            ssm_state_indices=torch.arange(seqs, dtype=i32), use_qk_l2norm_in_kernel=True)

    def conv_prefill() -> Any:
        return engine_op(VLLM_CONV, "causal_conv1d_fn")(
            torch.zeros(conv_dim, tokens, dtype=bf16), torch.zeros(conv_dim, width, dtype=bf16),
            None, conv_states=torch.zeros(2, conv_dim, width - 1, dtype=bf16),
            query_start_loc=cu.to(i32), cache_indices=torch.tensor([0], dtype=i32),
            has_initial_state=torch.tensor([False]), activation="silu")

    def conv_decode() -> Any:
        return engine_op(VLLM_CONV, "causal_conv1d_update")(
            torch.zeros(seqs, conv_dim, dtype=bf16),
            torch.zeros(seqs + 1, conv_dim, width - 1, dtype=bf16),
            torch.zeros(conv_dim, width, dtype=bf16), None, "silu",
            conv_state_indices=torch.arange(seqs, dtype=i32))

    def gated_norm() -> Any:
        return engine_op(VLLM_FLA, "layernorm_guard.rmsnorm_fn")(
            torch.zeros(tokens * hv, d, dtype=bf16), torch.ones(d, dtype=bf16), None,
            z=torch.zeros(tokens * hv, d, dtype=bf16), eps=1e-6, group_size=d,
            norm_before_gate=True)

    return [("gdn-prefill-chunk", chunk), ("gdn-prefill-prep", prep), ("gdn-decode", decode),
            ("gdn-decode-mixed", mixed_decode), ("conv1d-prefill", conv_prefill),
            ("conv1d-decode", conv_decode),
            ("gated-rmsnorm", gated_norm)]


SGLANG_FLA = ["sglang.kernels.ops.attention.fla"]
SGLANG_CONV = ["sglang.kernels.ops.mamba.causal_conv1d_triton"]


def sglang_gdn_calls(shape: dict[str, int]) -> list[tuple[str, Callable[[], Any]]]:
    """(family, call) of every Triton op SGLang's GDN backend (sglang/srt/layers/attention/
    linear/gdn_backend.py, Triton kernels) launches for a Qwen3.5/3.6 GDN layer at the model's
    shapes (TP 1): prefill = conv1d over the strided projection (the Triton conv1d: SGLang takes
    it for a strided input with seq_lens_cpu), the fused QKV split, the gating, the chunked
    delta rule and the gated RMSNorm; decode = conv1d update and the packed recurrent update."""
    import torch

    hk, hv, d, width = (shape["gdn_key_heads"], shape["gdn_value_heads"], shape["gdn_head_dim"],
                        shape["gdn_conv_width"])
    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    tokens, seqs, slots = 64, 4, 8
    conv_dim = 2 * hk * d + hv * d
    cu = torch.tensor([0, tokens], dtype=i32)

    def conv_prefill() -> Any:
        projected = torch.zeros(tokens, conv_dim, dtype=bf16)
        return engine_op(SGLANG_CONV, "causal_conv1d_fn")(
            projected.transpose(0, 1), torch.zeros(conv_dim, width, dtype=bf16), None,
            conv_states=torch.zeros(slots, conv_dim, width - 1, dtype=bf16),
            query_start_loc=cu, seq_lens_cpu=[tokens],
            cache_indices=torch.tensor([0], dtype=i32),
            has_initial_state=torch.tensor([False]), activation="silu")

    def split() -> Any:
        return importlib.import_module("sglang.kernels.ops.attention.triton_gdn_fused_proj") \
            .fused_qkv_split_gdn_prefill(torch.zeros(tokens, conv_dim, dtype=bf16), hk, hk, hv,
                                         d, d, d)

    def gating() -> Any:
        return importlib.import_module("sglang.kernels.ops.attention.linear.fused_gdn_gating") \
            .fused_gdn_gating(torch.zeros(hv, dtype=f32), torch.zeros(tokens, hv, dtype=bf16),
                              torch.zeros(tokens, hv, dtype=bf16), torch.zeros(hv, dtype=f32))

    def chunk() -> Any:
        return engine_op(SGLANG_FLA, "chunk.chunk_gated_delta_rule")(
            q=torch.zeros(1, tokens, hk, d, dtype=bf16), k=torch.zeros(1, tokens, hk, d, dtype=bf16),
            v=torch.zeros(1, tokens, hv, d, dtype=bf16), g=torch.zeros(1, tokens, hv, dtype=f32),
            beta=torch.zeros(1, tokens, hv, dtype=bf16),
            initial_state=torch.zeros(slots, hv, d, d, dtype=f32),
            initial_state_indices=torch.tensor([0], dtype=i32), cu_seqlens=cu.to(torch.int64),
            use_qk_l2norm_in_kernel=True)

    def gated_norm() -> Any:
        return engine_op(SGLANG_FLA, "layernorm_gated._layer_norm_fwd")(
            torch.zeros(tokens * hv, d, dtype=bf16), torch.ones(d, dtype=bf16), None, 1e-6,
            z=torch.zeros(tokens * hv, d, dtype=bf16), group_size=None,
            norm_before_gate=True, is_rms_norm=True)

    def conv_decode() -> Any:
        return engine_op(SGLANG_CONV, "causal_conv1d_update")(
            torch.zeros(seqs, conv_dim, dtype=bf16),
            torch.zeros(slots, conv_dim, width - 1, dtype=bf16),
            torch.zeros(conv_dim, width, dtype=bf16), None, "silu",
            conv_state_indices=torch.arange(seqs, dtype=i32))

    def decode() -> Any:
        return engine_op(SGLANG_FLA, "fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode")(
            mixed_qkv=torch.zeros(seqs, conv_dim, dtype=bf16),
            a=torch.zeros(seqs, hv, dtype=bf16), b=torch.zeros(seqs, hv, dtype=bf16),
            A_log=torch.zeros(hv, dtype=f32), dt_bias=torch.zeros(hv, dtype=f32),
            scale=d ** -0.5, initial_state=torch.zeros(slots, hv, d, d, dtype=f32),
            out=torch.zeros(seqs, 1, hv, d, dtype=bf16),
            ssm_state_indices=torch.arange(seqs, dtype=i32), use_qk_l2norm_in_kernel=True)

    return [("conv1d-prefill", conv_prefill), ("gdn-prefill-split", split),
            ("gdn-prefill-gating", gating), ("gdn-prefill-chunk", chunk),
            ("gated-rmsnorm", gated_norm), ("conv1d-decode", conv_decode),
            ("gdn-decode", decode)]


def drive_fixture(cc: tuple[int, int], shape: dict[str, int], path: str) -> list[dict[str, Any]]:
    """A kernel file with `drive(cc, shape)` (tests): its launcher picks blocks by capability.
    It is imported under the compile-only driver, as an engine's kernels are: a tile list
    chosen at import from the device's limits sees the target's."""
    import importlib.util

    def load_and_drive() -> None:
        spec = importlib.util.spec_from_file_location("triton_smem_fixture", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # triton.jit reads the source through the module
        spec.loader.exec_module(module)
        module.drive(cc, shape)

    return [drive_one("fixture", load_and_drive, cc, shape.get("limit", 0))]


def not_driven(family: str, exc: BaseException) -> dict[str, Any]:
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
    return {"family": family, "driven": False, "reason": f"{type(exc).__name__}: {exc}"[:600],
            "traceback_tail": tail[-1500:], "kernels": []}


def drive_one(family: str, call: Callable[[], Any], cc: tuple[int, int],
              limit: int = 0) -> dict[str, Any]:
    compiled: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        with compile_only(cc, compiled, limit):
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

def summarise_kernels(family: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """One row per kernel of a family: its configs (an autotune group, or one launch), their
    bytes, how many are over `limit`, and the verdict as the runtime would reach it: an
    autotuned kernel fails only when no config fits (the autotuner skips a config that runs
    out of resources); a kernel without alternatives fails when its one config is over."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for i, record in enumerate(family.get("kernels", [])):
        key = record.get("autotune") or f"{record['kernel']}@{i}"
        groups.setdefault(key, []).append(record)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for records in groups.values():
        sizes = [r["shared"] for r in records if "shared" in r]
        over = sum(size > limit for size in sizes)
        broken = sum("compile_error" in r for r in records)
        usable = len(sizes) - over
        autotuned = len(records) > 1 or bool(records[0].get("autotune"))
        row = {"kernel": records[0]["kernel"], "family": family["family"],
               "configs": len(records), "autotuned": autotuned,
               "min_shared": min(sizes) if sizes else None,
               "max_shared": max(sizes) if sizes else None, "over": over,
               "compile_errors": broken, "limit": limit, "fits": usable > 0,
               "compile_s": round(sum(r.get("compile_s", 0.0) for r in records), 2)}
        if usable and (over or broken):
            row["note"] = (f"{over + broken} of {len(records)} autotune configs cannot run "
                           f"(over {limit} B or not compiled); the autotuner skips them")
        key = (row["kernel"], tuple(sorted(
            (r.get("num_warps"), r.get("num_stages"), r["shared"] if "shared" in r else -1)
            for r in records)))
        rows.setdefault(key, row)  # the same kernel launched twice at the same configs
    return list(rows.values())


def judge(arch: str, limit: int, families: list[dict[str, Any]]) -> dict[str, Any]:
    over, undriven, notes = [], [], []
    for family in families:
        if not family.get("driven"):
            undriven.append(f"{family['family']}: {family.get('reason')}")
        elif family.get("note", "").startswith("launcher stopped"):
            undriven.append(f"{family['family']} (partly: its later kernels were not reached): "
                            f"{family['note']}")
        for kernel in family.get("kernels", []):
            if "shared" in kernel:
                kernel["limit"] = limit
                kernel["fits"] = kernel["shared"] <= limit
        family["summary"] = summarise_kernels(family, limit)
        for row in family["summary"]:
            if not row["fits"]:
                over.append(f"{row['kernel']} ({family['family']}) needs {row['min_shared']} "
                            f"bytes of shared memory per block on {arch} at its smallest of "
                            f"{row['configs']} config(s); the limit is {limit}")
            elif row.get("note"):
                notes.append(f"{row['kernel']} ({family['family']}): {row['note']}")
    status = "fail" if over else "skip" if undriven else "pass"
    reason = "; ".join(over) if over else \
        ("kernels not driven, so not checked: " + "; ".join(undriven)) if undriven else None
    return {"arch": arch, "limit": limit, "status": status, "reason": reason, "notes": notes,
            "families": families}


def refuse_cpu_torch() -> str | None:
    """Why the engine's launchers cannot be driven faithfully here: under a CPU-only torch they
    pick other block sizes (SGLang reads torch.version.cuda), so a pass would be false."""
    try:
        import torch
    except ImportError:
        return None  # the engine import reports it
    if getattr(torch.version, "cuda", None) is None:
        return (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): "
                "the engine's launchers would choose other block sizes than on a GPU, so the "
                "harness refuses to judge them")
    return None


# The model's shape, each a flag (--head-dim ...); gdn_key_heads 0: no Gated DeltaNet layers
SHAPE_DEFAULTS = {"head_dim": 256, "q_heads": 24, "kv_heads": 4, "vision_head_dim": 72,
                  "vision_heads": 16, "gdn_key_heads": 0, "gdn_value_heads": 0,
                  "gdn_head_dim": 128, "gdn_conv_width": 4}


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    return {name: getattr(args, name) for name in SHAPE_DEFAULTS}


def one_arch(args: argparse.Namespace) -> int:
    watch_chunk_o_imports()  # before any engine module loads
    arch, limit = args.one_arch.split("=")
    cc = parse_arch(arch)
    shape = model_shape(args)
    refused = None if args.fixture else refuse_cpu_torch()
    if refused:
        return emit({"check": "triton-smem", "arch": arch, "limit": int(limit),
                     "status": "fail", "refused": True, "reason": refused, "families": []})
    paths = resolve_paths(args.engine, cc, shape, args.serve_arg) if not args.fixture else {}
    if args.paths_only:
        return emit({"check": "triton-paths", "arch": arch, "paths": paths,
                     "status": "pass" if all(p.get("chosen") for p in paths.values())
                     else "skip"})
    try:
        families = drive_fixture(cc, {**shape, "limit": int(limit)}, args.fixture) \
            if args.fixture else DRIVERS[args.engine](cc, shape, int(limit))
    except Exception as exc:  # noqa: BLE001
        families = [not_driven(args.engine, exc)]
    verdict = judge(arch, int(limit), families)
    chosen_broken = [f"{name}: the engine chooses {p['chosen']} ({p['source']}), and "
                     f"{p.get('kernel')} cannot run here: {p['import_error']}"
                     for name, p in paths.items() if p.get("importable") is False]
    if chosen_broken:
        verdict["status"] = "fail"
        verdict["reason"] = "; ".join(filter(None, [verdict.get("reason"), *chosen_broken]))
    return emit({"check": "triton-smem", **verdict, "paths": paths,
                 "first_start": first_start(families, paths)})


def first_start(families: list[dict[str, Any]], paths: dict[str, Any]) -> list[dict[str, Any]]:
    """What the engine compiles at its first start for this serve path, with the cost measured
    here where it can be: the Triton kernels (compile seconds on this CPU for the target;
    autotuned ones also benchmark each config on the GPU) and the JIT kernels of the chosen
    paths (not measurable without a GPU: said so)."""
    rows = [row for family in families for row in family.get("summary", [])]
    items = []
    if rows:
        tuned = [r for r in rows if r["autotuned"]]
        items.append({"what": "Triton kernels", "count": len(rows),
                      "configs": sum(r["configs"] for r in rows),
                      "compile_s_here": round(sum(r["compile_s"] for r in rows), 1),
                      "autotuned": len(tuned),
                      "note": "compiled at the engine's first start (the image holds no "
                              "Triton cache); each autotuned kernel also benchmarks its "
                              f"{sum(r['configs'] for r in tuned)} configs on the GPU"})
    for name, path in paths.items():
        if path.get("chosen") and path.get("chosen") != "triton" and path.get("kernel"):
            items.append({"what": f"{name}: {path['kernel']}",
                          "compiled_at": path.get("compiled_at"),
                          "note": "compiled at first start; cost not measured here (a CuTe "
                                  "DSL compile needs the GPU's driver)"})
    return items


# --------------------------------------------------------------------------------------------
# The path really taken: the engine's own selection logic, at the target's capability
# --------------------------------------------------------------------------------------------

def resolve_paths(engine: str, cc: tuple[int, int], shape: dict[str, int],
                  serve_args: list[str]) -> dict[str, Any]:
    """Backend choices the engine makes for this model, target and serve command, each with
    the function that made it. A choice that cannot be resolved says why."""
    if not shape.get("gdn_key_heads"):
        return {}
    if engine == "sglang":
        return resolve_sglang_paths(cc, shape, serve_args)
    if engine != "vllm":
        return {}
    requested = flag_value(serve_args, "--gdn-prefill-backend") or "auto"
    module_name = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
    source = f"{module_name}._resolve_gdn_prefill_backend"
    import torch
    from types import SimpleNamespace

    try:
        pretend_cuda(cc)
        pretend_vllm_platform(cc)
        resolve = engine_function(module_name, "_resolve_gdn_prefill_backend",
                                  vllm_selection_names(module_name),
                                  helpers=("_aiter_flydsl_unsupported_reasons",
                                           "xpu_gdn_kernel_available"))
        if "xpu_gdn_kernel_available" in resolve.__globals__:
            resolve.__globals__["xpu_gdn_kernel_available"] = lambda: False
    except Exception as exc:  # noqa: BLE001
        return unresolved(requested, source, exc, "not resolved: ")
    text = SimpleNamespace(linear_key_head_dim=shape["gdn_head_dim"],
                           linear_value_head_dim=shape["gdn_head_dim"])
    config = SimpleNamespace(additional_config={"gdn_prefill_backend": requested},
                             model_config=SimpleNamespace(hf_text_config=text,
                                                          dtype=torch.bfloat16))
    try:
        _, chosen = resolve(config)
    except Exception as exc:  # noqa: BLE001 - e.g. a backend the platform refuses
        return unresolved(requested, source, exc)
    path = {"requested": requested, "chosen": chosen, "source": source,
            "cuda_runtime": torch.version.cuda,
            "fallback": "triton" if chosen != "triton" else None}
    if chosen == "flashinfer":
        path.update(flashinfer_gdn_kernel(cc))
    return {"gdn_prefill": path}


def unresolved(requested: str, source: str, exc: Exception, prefix: str = "") -> dict[str, Any]:
    """The GDN prefill choice the engine's selection function did not make, and why."""
    return {"gdn_prefill": {"requested": requested, "chosen": None, "source": source,
                            "reason": f"{prefix}{type(exc).__name__}: {exc}"[:400]}}


# FlashInfer's GDN prefill kernel per major (flashinfer/gdn_prefill.py dispatches on the major;
# the sm_90 and sm_120 ones are CuTe DSL kernels, compiled at first call)
FLASHINFER_GDN = {9: "chunk_gated_delta_rule_sm90", 10: "chunk_gated_delta_rule_sm100",
                  12: "chunk_gated_delta_rule_sm120"}


def flashinfer_gdn_kernel(cc: tuple[int, int]) -> dict[str, Any]:
    """Whether the FlashInfer GDN prefill kernel the engine will call for `cc` imports in this
    image. flashinfer.gdn_kernels sets it to None when its CuTe DSL import fails with
    ImportError/RuntimeError, and fails to import at all on other errors: either way the
    engine's first prefill raises."""
    name = FLASHINFER_GDN.get(cc[0])
    record: dict[str, Any] = {"kernel": f"flashinfer.gdn_kernels.{name}" if name else None,
                              "compiled_at": "first call (CuTe DSL JIT)"}
    if name is None:
        return {**record, "importable": False,
                "import_error": f"flashinfer has no GDN prefill kernel for major {cc[0]}"}
    try:
        module = importlib.import_module("flashinfer.gdn_kernels")
        importlib.import_module("flashinfer.gdn_prefill")
    except Exception as exc:  # noqa: BLE001 - what the engine's first prefill would raise
        return {**record, "importable": False,
                "import_error": f"import flashinfer.gdn_prefill: {type(exc).__name__}: {exc}"[:500]}
    if getattr(module, name, None) is None:
        return {**record, "importable": False,
                "import_error": f"flashinfer.gdn_kernels.{name} is None (its CuTe DSL module "
                                "did not import)"}
    return {**record, "importable": True}


class _NotOnThisPlatform:
    def __getattr__(self, attr: str) -> Any:
        return lambda *a, **k: False  # ROCm/XPU-only probes: never on a CUDA target


def vllm_selection_names(module_name: str) -> dict[str, Any]:
    """The module-level names vLLM's selection functions read, on the pretended platform."""
    import logging
    import typing

    import torch
    from vllm.platforms import current_platform

    return {"current_platform": current_platform, "torch": torch, "Literal": typing.Literal,
            "VllmConfig": Any, "logger": logging.getLogger(module_name),
            "rocm_aiter_ops": _NotOnThisPlatform()}


def engine_function(module_name: str, name: str, names: dict[str, Any],
                    helpers: tuple[str, ...] = ()) -> Any:
    """A selection function of the engine, executed from the engine's installed source file.
    Importing its module would load the engine's CUDA extension (or its whole runtime), which
    needs a driver; the function itself only reads the platform, the config and the names
    given here. Anything else it reaches is an error reported as not resolved."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise ModuleNotFoundError(module_name)
    tree = ast.parse(open(spec.origin, encoding="utf-8").read(), spec.origin)
    wanted = {name, *helpers}
    body: list[ast.stmt] = [node for node in tree.body
                            if isinstance(node, ast.FunctionDef) and node.name in wanted]
    if name not in {node.name for node in body if isinstance(node, ast.FunctionDef)}:
        raise AttributeError(f"{module_name} has no function {name}")
    namespace: dict[str, Any] = {**names, "__name__": module_name}
    exec(compile(ast.Module(body=body, type_ignores=[]), spec.origin, "exec"), namespace)
    return namespace[name]


SGLANG_GDN_MODULE = "sglang.srt.layers.attention.linear.gdn_backend"
SGLANG_LINEAR_UTILS = "sglang.srt.layers.attention.linear.utils"
SGLANG_CHUNKED_PREFILL = 8192  # what SGLang sets for a GPU of this memory class (server_args)


def resolve_sglang_paths(cc: tuple[int, int], shape: dict[str, int],
                         serve_args: list[str]) -> dict[str, Any]:
    """SGLang's GDN kernel choice per phase from its own functions, run from the installed
    source: `flashinfer_gdn_prefill_default` (FlashInfer only on the SM90/SM100 domains it
    validated) then `resolve_linear_attn_backends` (an explicit --linear-attn-*-backend
    wins). The serve command's flags fill the runtime config they read; the GDN dispatcher
    runs a cutedsl prefill as Triton off SM10x, and that is recorded too."""
    import logging
    from types import SimpleNamespace

    import torch

    source_default = f"{SGLANG_GDN_MODULE}.flashinfer_gdn_prefill_default"
    source = f"{SGLANG_LINEAR_UTILS}.resolve_linear_attn_backends"
    base = flag_value(serve_args, "--linear-attn-backend") or "triton"
    requested = {phase: flag_value(serve_args, f"--linear-attn-{phase}-backend")
                 for phase in ("prefill", "decode", "verify")}

    try:
        pretend_cuda(cc)
        utils = importlib.import_module(SGLANG_LINEAR_UTILS)
        mamba = SimpleNamespace(linear_attn_backend=base,
                                linear_attn_prefill_backend=requested["prefill"],
                                linear_attn_decode_backend=requested["decode"],
                                linear_attn_verify_backend=requested["verify"])
        runtime = SimpleNamespace(
            mamba=mamba, deterministic=SimpleNamespace(
                enable_deterministic_inference="--enable-deterministic-inference" in serve_args))
        chunk = flag_value(serve_args, "--chunked-prefill-size")
        schedule = SimpleNamespace(chunked_prefill_size=int(chunk) if chunk else
                                   SGLANG_CHUNKED_PREFILL,
                                   enable_dynamic_chunking="--enable-dynamic-chunking"
                                   in serve_args)
        names = {"torch": torch, "is_cuda": lambda: True, "get_exec": lambda: runtime,
                 "get_schedule": lambda: schedule, "hybrid_gdn_config": lambda config: config,
                 "rank0_log": logging.getLogger("sglang").info, "Optional": Optional,
                 "LinearAttnKernelBackend": utils.LinearAttnKernelBackend,
                 "LinearAttnBackends": utils.LinearAttnBackends, "ModelRunner": Any}
        prefill_default = engine_function(SGLANG_GDN_MODULE, "flashinfer_gdn_prefill_default",
                                          names)
        resolve = engine_function(SGLANG_LINEAR_UTILS, "resolve_linear_attn_backends", names)
    except Exception as exc:  # noqa: BLE001
        return unresolved(requested["prefill"] or base, source, exc, "not resolved: ")
    ssm = torch.bfloat16 if flag_value(serve_args, "--mamba-ssm-dtype") == "bfloat16" \
        else torch.float32
    runner = SimpleNamespace(
        model_config=SimpleNamespace(linear_key_head_dim=shape["gdn_head_dim"],
                                     linear_value_head_dim=shape["gdn_head_dim"]),
        req_to_token_pool=SimpleNamespace(mamba_pool=SimpleNamespace(
            mamba_cache=SimpleNamespace(temporal=SimpleNamespace(dtype=ssm)))))
    try:
        default = prefill_default(runner)
        backends = resolve(prefill_default=default)
    except Exception as exc:  # noqa: BLE001 - e.g. a backend the platform refuses
        return unresolved(requested["prefill"] or base, source, exc)
    prefill = {"requested": requested["prefill"] or "auto", "chosen": backends.prefill.value,
               "default": default, "source": f"{source_default}, {source}",
               "cuda_runtime": torch.version.cuda,
               "fallback": "triton" if backends.prefill.value != "triton" else None}
    if backends.prefill.value == "cutedsl" and cc[0] != 10:
        prefill.update(chosen="triton", fallback=None,
                       note="cutedsl GDN prefill exists on SM10x only; GDNKernelDispatcher "
                            "runs Triton here")
    if prefill["chosen"] == "flashinfer":
        prefill.update(flashinfer_gdn_kernel(cc))
    decode = {"requested": requested["decode"] or base, "chosen": backends.decode.value,
              "source": source}
    if decode["chosen"] in ("cutedsl", "flashinfer"):  # kernels built at their first call
        decode.update(kernel=f"sglang.srt.layers.attention.linear.kernels.gdn_"
                             f"{decode['chosen']}", compiled_at="first call (CuTe DSL JIT)")
    return {"gdn_prefill": prefill, "gdn_decode": decode}


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(DRIVERS), default="sglang")
    parser.add_argument("--backend", default="triton", help="the cell's attention backend")
    parser.add_argument("--arch", action="append", default=[], metavar="SM=BYTES",
                        help="target arch and its shared memory limit per block, e.g. sm_120=101376")
    for name, default in SHAPE_DEFAULTS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="one argument of the cell's serve command (repeatable): flags "
                             "such as --gdn-prefill-backend change the path resolved")
    parser.add_argument("--paths-only", action="store_true",
                        help="resolve the engine's backend choices only; compile nothing")
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
