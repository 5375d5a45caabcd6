"""GPU level: the visible device is the cell's arch, and real kernels run and agree with torch.

    python3 -m harness.gpu_check --arch sm_120 --kernels flash-attn flashinfer-python \
        [--engine vllm|sglang|none] [--gdn auto|vllm|sglang|fla|off]

Checks, each pass/fail/skip with a reason, and for numeric ones the max abs error against the
reference, the tolerance, the shapes and the duration:
  device       compute capability of device 0 against the arch (sm_120 / sm_120a: exactly 12.0;
               sm_120f: family 12.x with minor >= 0); driver version from nvidia-smi when present
  torch        a matmul on the GPU against a float64 CPU reference
  triton       a Triton kernel. Missing triton is a skip only where the image claims no engine
               (`--engine`, else an importable vllm/sglang): engines' GDN/attention paths need it
  <package>    each compiled kernel package against a torch reference, at the model's shapes
               (harness/gpu_ops.py): flash-attn forward + backward at head dim 256 (dropout
               backward checked, or its known refusal on 99 KB devices), FlashInfer batch
               prefill/decode over a paged KV cache
  gdn          Gated DeltaNet chunked prefill, recurrent decode and causal conv1d against a naive
               recurrence: the engine's own Triton ops, else the standalone `fla` package; which
               one ran is recorded. Required (a fail when none imports) in an engine image
With no GPU visible the result is `skip` with the reason. Prints one result line; exit 1 on fail.
A warning alone proves nothing: every check launches a kernel and compares numbers.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

try:
    from . import gpu_ops
    from ._result import emit, overall
except ImportError:  # pragma: no cover
    import gpu_ops  # type: ignore[no-redef]
    from _result import emit, overall  # type: ignore[no-redef]


def parse_arch(arch: str) -> tuple[int, int, str]:
    """`sm_120a` -> (12, 0, "a"); `sm_90` -> (9, 0, "")."""
    digits = arch.split("_", 1)[1]
    suffix = digits[-1] if digits[-1] in "af" else ""
    digits = digits.rstrip("af")
    return int(digits[:-1]), int(digits[-1]), suffix


def arch_matches(arch: str, capability: tuple[int, int]) -> bool:
    """Whether a device of `capability` is the GPU an `arch` cell targets.

    Plain and `a` targets name one capability; an `f` (family) target covers the same major with
    an equal or higher minor (NVIDIA's family-specific features: sm_120f runs on 12.0 and 12.1).
    """
    major, minor, suffix = parse_arch(arch)
    if suffix == "f":
        return capability[0] == major and capability[1] >= minor
    return capability == (major, minor)


def timed(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - a kernel crash is a result, not a harness bug
        tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
        result = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}"[:1000],
                  "traceback_tail": tail[-2000:]}
    return {"check": name, **result, "duration_s": round(time.monotonic() - started, 3)}


def compare(name: str, got, want, atol: float, rtol: float) -> dict[str, Any]:
    import torch

    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    if not torch.isfinite(got64).all():
        return {"status": "fail", "reason": f"{name}: non-finite values in the GPU result"}
    err = (got64 - want64).abs().max().item()
    ok = torch.allclose(got64, want64, atol=atol, rtol=rtol)
    result = {"max_abs_error": err, "atol": atol, "rtol": rtol}
    if not ok:
        return {**result, "status": "fail",
                "reason": f"{name}: GPU result differs from the torch reference (max abs error {err:.3g})"}
    return {**result, "status": "pass"}


def nvidia_smi() -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=name,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not first:
        return {}
    fields = [f.strip() for f in first[0].split(",")]
    return dict(zip(("name", "compute_cap", "driver_version"), fields))


def check_device(arch: str) -> dict[str, Any]:
    import torch

    capability = torch.cuda.get_device_capability(0)
    facts = {"device": torch.cuda.get_device_name(0), "capability": f"{capability[0]}.{capability[1]}",
             "arch": arch, "torch_arch_list": torch.cuda.get_arch_list(), **nvidia_smi()}
    if not arch_matches(arch, capability):
        return {**facts, "status": "fail",
                "reason": f"device {facts['device']} has compute capability {facts['capability']}, "
                          f"the cell targets {arch}"}
    return {**facts, "status": "pass"}


def check_torch_matmul() -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 512, generator=gen, dtype=torch.float64)
    b = torch.randn(512, 128, generator=gen, dtype=torch.float64)
    results = {}
    for dtype, atol in ((torch.float32, 1e-2), (torch.bfloat16, 1.0)):
        got = (a.to("cuda", dtype) @ b.to("cuda", dtype))
        torch.cuda.synchronize()
        want = a.to(dtype).double() @ b.to(dtype).double()
        results[str(dtype)] = compare(f"matmul {dtype}", got, want, atol=atol, rtol=2e-2)
    failed = [r for r in results.values() if r["status"] == "fail"]
    return {"status": "fail" if failed else "pass", "dtypes": results,
            **({"reason": failed[0]["reason"]} if failed else {})}


def check_triton(engine: str | None = None) -> dict[str, Any]:
    try:
        import triton  # noqa: F401
    except ImportError:
        return gpu_ops.triton_missing(engine)
    import torch

    from ._triton_kernel import triton_add

    x = torch.randn(4099, device="cuda")
    y = torch.randn(4099, device="cuda")
    got = triton_add(x, y)
    torch.cuda.synchronize()
    return compare("triton add", got, x + y, atol=1e-6, rtol=1e-6)


def check_cudakern() -> dict[str, Any]:
    """The test fixture kernel package: saxpy and a sum through ctypes."""
    import ctypes

    import cudakern
    import torch

    lib = cudakern.load()
    n = 10_000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    want = 2.5 * x + y
    code = lib.cudakern_saxpy(ctypes.c_int(n), ctypes.c_float(2.5),
                              ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()))
    torch.cuda.synchronize()
    if code != 0:
        return {"status": "fail", "reason": f"cudakern_saxpy returned CUDA error {code}"
                + (" (no kernel image is available for this device)" if code == 209 else "")}
    saxpy = compare("cudakern saxpy", y, want, atol=1e-5, rtol=1e-5)
    if saxpy["status"] == "fail":
        return saxpy
    out = torch.zeros(1, device="cuda")
    code = lib.cudakern_sum(ctypes.c_int(n), ctypes.c_void_p(x.data_ptr()),
                            ctypes.c_void_p(out.data_ptr()))
    torch.cuda.synchronize()
    if code != 0:
        return {"status": "fail", "reason": f"cudakern_sum returned CUDA error {code}"}
    return compare("cudakern sum", out, x.double().sum().reshape(1), atol=1e-2, rtol=1e-4)


def check_flash_attn() -> dict[str, Any]:
    """Forward + backward at the model's head dim 256 (the training profile), dropout included."""
    return gpu_ops.check_flash_attn()


def rmsnorm_reference(x, weight, eps: float):
    import torch

    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float())


def check_flashinfer() -> dict[str, Any]:
    import flashinfer
    import torch

    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    got = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
    torch.cuda.synchronize()
    norm = compare("flashinfer rmsnorm", got, rmsnorm_reference(x, w, 1e-6), atol=5e-2, rtol=2e-2)
    attention = gpu_ops.check_flashinfer_attention()
    parts = {"rmsnorm": norm, **attention.pop("compared")}
    return gpu_ops.combine(parts, **{k: v for k, v in attention.items()
                                     if k not in ("status", "reason", "max_abs_error")})


def check_sgl_kernel() -> dict[str, Any]:
    import sgl_kernel
    import torch

    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    got = sgl_kernel.rmsnorm(x, w, 1e-6)
    torch.cuda.synchronize()
    return compare("sgl_kernel rmsnorm", got, rmsnorm_reference(x, w, 1e-6), atol=5e-2, rtol=2e-2)


# A kernel check per compiled kernel package (distribution name). A package without one fails
# the level: an untested kernel package is not verified.
KERNEL_CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "cudakern": check_cudakern,
    "flash-attn": check_flash_attn,
    "flashinfer-python": check_flashinfer,
    "sglang-kernel": check_sgl_kernel,
    "sgl-kernel": check_sgl_kernel,
}


def check_kernel_package(name: str) -> dict[str, Any]:
    check = KERNEL_CHECKS.get(name)
    if check is None:
        return {"status": "fail", "reason": f"no numeric check is known for kernel package {name}; "
                                            "add one to harness/gpu_check.py KERNEL_CHECKS"}
    return check()


def no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return "no GPU visible (torch.cuda.is_available() is False)"
    return None


def check_gdn(engine: str | None, gdn: str) -> dict[str, Any]:
    """The Gated DeltaNet ops: required in an engine image (its model layers are these ops)."""
    preferred = None if gdn == "auto" else gdn
    return gpu_ops.check_gdn(preferred=preferred, required=bool(engine) or preferred is not None)


def run_checks(arch: str, kernels: list[str], engine: str | None = None,
               gdn: str = "auto") -> dict[str, Any]:
    skip = no_gpu_reason()
    if skip:
        return {"check": "gpu", "status": "skip", "reason": skip, "arch": arch, "checks": []}
    checks = [timed("device", lambda: check_device(arch)),
              timed("torch", check_torch_matmul),
              timed("triton", lambda: check_triton(engine))]
    checks += [timed(name, functools.partial(check_kernel_package, name)) for name in kernels]
    if gdn != "off":
        checks.append(timed("gdn", lambda: check_gdn(engine, gdn)))
    result = {"check": "gpu", "status": overall(checks), "arch": arch, "engine": engine,
              "checks": checks}
    failed = [c for c in checks if c["status"] == "fail"]
    if failed:
        result["reason"] = "; ".join(f"{c['check']}: {c['reason']}" for c in failed)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, help="the cell's arch, e.g. sm_120")
    parser.add_argument("--kernels", nargs="*", default=[], metavar="DIST",
                        help="compiled kernel packages (distribution names) to run")
    parser.add_argument("--engine", default=None,
                        help="the engine the image claims (vllm, sglang; 'none' for no engine); "
                             "default: an importable vllm/sglang")
    parser.add_argument("--gdn", default="auto", choices=["auto", "vllm", "sglang", "fla", "off"],
                        help="Gated DeltaNet implementation to check (auto: the engine's, "
                             "else fla)")
    args = parser.parse_args(argv)
    engine = gpu_ops.engine_claim(args.engine)
    return emit(run_checks(args.arch, args.kernels, engine, args.gdn))


if __name__ == "__main__":
    sys.exit(main())
