#!/usr/bin/env python3
"""Hold the audit's coverage verdicts against what a real GPU driver does.

Runs on any host with an NVIDIA GPU, its driver, nvcc and cuobjdump (no Docker, no network):

    PYTHONPATH=src python3 scripts/gpu_coverage_check.py --out verdicts.md

For each case it compiles one tiny kernel into a shared object for some targets (cubins and/or
PTX), asks the audit (infermatrix.audit.list_device_code: cuobjdump plus the fat binary headers,
then infermatrix.coverage.decide) whether that object runs on this GPU's compute capability,
then launches the kernel in a fresh process (JIT cache off) and checks its result: through the
CUDA runtime for kernels in .nv_fatbin, through cuModuleLoadData for a fat binary the library
keeps in its own data (as cuFFT does). It prints a Markdown table
of verdict against launch and exits 1 if any case disagrees (2 when nothing could run).
If torch is installed, libtorch_cuda.so gets the same treatment (verdict vs a real torch op).
`--dry-run` compiles and judges without launching (for machines without a GPU).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infermatrix.stages.audit import find_cuobjdump, list_device_code
from infermatrix.model.coverage import Arch, Decision, decide

KERNEL = r"""
#include <cuda_runtime.h>
extern "C" __global__ void add_one(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
// Returns a cudaError_t; *ok is 1 when every element came back as 1.0.
extern "C" int launch(int *ok) {
    const int n = 256;
    float host[n];
    float *dev = nullptr;
    *ok = 0;
    cudaError_t err = cudaMalloc(&dev, n * sizeof(float));
    if (err != cudaSuccess) return err;
    cudaMemset(dev, 0, n * sizeof(float));
    add_one<<<1, n>>>(dev, n);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(dev);
    if (err != cudaSuccess) return err;
    *ok = 1;
    for (int i = 0; i < n; ++i) if (host[i] != 1.0f) *ok = 0;
    return 0;
}
extern "C" const char *error_name(int err) { return cudaGetErrorName((cudaError_t)err); }
"""

# (case name, nvcc -gencode values): cubins (code=sm_*) and PTX (code=compute_*).
CASES: list[tuple[str, list[str]]] = [
    ("sm_90 cubin", ["arch=compute_90,code=sm_90"]),
    ("sm_90a cubin", ["arch=compute_90a,code=sm_90a"]),
    ("sm_80 cubin only", ["arch=compute_80,code=sm_80"]),
    ("sm_89 cubin only", ["arch=compute_89,code=sm_89"]),
    ("compute_80 PTX only", ["arch=compute_80,code=compute_80"]),
    ("compute_90a PTX only", ["arch=compute_90a,code=compute_90a"]),
    ("compute_100 PTX only", ["arch=compute_100,code=compute_100"]),
    ("sm_120 cubin only", ["arch=compute_120,code=sm_120"]),
    ("sm_100f cubin only", ["arch=compute_100f,code=sm_100f"]),
    ("compute_120f PTX only", ["arch=compute_120f,code=compute_120f"]),
    ("sm_86 cubin + compute_80 PTX", ["arch=compute_86,code=sm_86",
                                      "arch=compute_80,code=compute_80"]),
    ("sm_80 + sm_90 cubins + compute_90 PTX", ["arch=compute_80,code=sm_80",
                                               "arch=compute_90,code=[sm_90,compute_90]"]),
    ("sm_120a + sm_100a cubins", ["arch=compute_120a,code=sm_120a",
                                  "arch=compute_100a,code=sm_100a"]),
]
# Fat binaries kept in the library's data and loaded with cuModuleLoadData.
EMBEDDED_CASES: list[tuple[str, list[str]]] = [
    ("embedded fatbin: sm_90 cubin", ["arch=compute_90,code=sm_90"]),
    ("embedded fatbin: sm_80 cubin only", ["arch=compute_80,code=sm_80"]),
    ("embedded fatbin: compute_80 PTX only", ["arch=compute_80,code=compute_80"]),
]


@dataclass
class Row:
    case: str
    targets: str
    cubins: str
    ptx: str
    verdict: Decision | None
    launch: str  # "ran", "no kernel image", an error name, or why it did not run
    ran: bool | None
    ms: float | None

    @property
    def agrees(self) -> bool | None:
        if self.verdict is None or self.ran is None:
            return None
        return self.verdict.covered == self.ran


def gpu_compute_capability() -> Arch:
    """The first GPU's compute capability through the CUDA driver API."""
    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) != 0:
        raise RuntimeError("cuInit failed: no usable GPU")
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # ..._COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # ..._COMPUTE_CAPABILITY_MINOR
    return Arch(major.value, minor.value)


def find_nvcc() -> str:
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (shutil.which("nvcc"), f"{home}/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("nvcc not found (set CUDA_HOME or PATH)")


def tool_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out)
    return f"{Path(binary).name} {match.group(1) if match else '?'} ({binary})"


def compile_case(nvcc: str, source: Path, gencodes: list[str], out: Path) -> str | None:
    """Build the shared object; the nvcc error text when this nvcc cannot build the case."""
    argv = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(source)]
    for gencode in gencodes:
        argv += ["-gencode", gencode]
    done = subprocess.run(argv, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-300:]


def compile_embedded_case(nvcc: str, source: Path, gencodes: list[str], out: Path) -> str | None:
    """A library with no .nv_fatbin (as cuFFT keeps its kernels): the kernel's fat binary is a
    byte array in its data, which the child loads with the driver API (cuModuleLoadData)."""
    fatbin = out.with_suffix(".fatbin")
    argv = [nvcc, "-fatbin", "-o", str(fatbin), str(source)]
    for gencode in gencodes:
        argv += ["-gencode", gencode]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip()[-300:]
    data = fatbin.read_bytes()
    blob = out.parent / "blob.c"
    blob.write_text("const unsigned char fatbin_blob[] __attribute__((aligned(8))) = {"
                    + ",".join(str(b) for b in data) + "};\n")
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    done = subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(blob)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-300:]


def launch_in_child(library: Path, driver: bool = False) -> dict:
    """Launch the kernel in a fresh process with the JIT cache off (a real first load)."""
    env = dict(os.environ, CUDA_CACHE_DISABLE="1")
    mode = "--launch-driver" if driver else "--launch"
    done = subprocess.run([sys.executable, __file__, mode, str(library)],
                          capture_output=True, text=True, env=env, timeout=120)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"launch": f"child exited {done.returncode}: {done.stderr.strip()[-200:]}",
                "ran": False, "ms": None}
    return json.loads(lines[-1])


def launch_here(library: str) -> None:
    lib = ctypes.CDLL(library)
    lib.error_name.restype = ctypes.c_char_p
    ok = ctypes.c_int(0)
    started = time.perf_counter()
    err = lib.launch(ctypes.byref(ok))
    ms = (time.perf_counter() - started) * 1000
    if err == 0:
        outcome = {"launch": "ran, result correct" if ok.value else "ran, WRONG result",
                   "ran": bool(ok.value), "ms": round(ms, 1)}
    else:
        name = lib.error_name(err).decode()
        no_image = name in ("cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU")
        label = "no kernel image" if no_image else name
        outcome = {"launch": f"{label} ({name})" if label != name else name, "ran": False,
                   "ms": round(ms, 1)}
    print(json.dumps(outcome))


def launch_with_driver(library: str) -> None:
    """cuModuleLoadData on the library's embedded fat binary, then cuLaunchKernel."""
    from ctypes import byref, c_float, c_int, c_size_t, c_uint64, c_void_p, cast

    cuda = ctypes.CDLL("libcuda.so.1")
    blob = ctypes.c_char.in_dll(ctypes.CDLL(library), "fatbin_blob")
    n = 256
    device, context, module, function = c_int(), c_void_p(), c_void_p(), c_void_p()
    dev, count = c_uint64(), c_int(n)
    started = time.perf_counter()
    steps = [lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(byref(device), 0),
             lambda: cuda.cuDevicePrimaryCtxRetain(byref(context), device),
             lambda: cuda.cuCtxSetCurrent(context),
             lambda: cuda.cuModuleLoadData(byref(module), c_void_p(ctypes.addressof(blob))),
             lambda: cuda.cuModuleGetFunction(byref(function), module, b"add_one"),
             lambda: cuda.cuMemAlloc_v2(byref(dev), c_size_t(n * 4)),
             lambda: cuda.cuMemsetD32_v2(dev, 0, c_size_t(n))]
    args = (c_void_p * 2)(cast(byref(dev), c_void_p), cast(byref(count), c_void_p))
    host = (c_float * n)()
    steps += [lambda: cuda.cuLaunchKernel(function, 1, 1, 1, n, 1, 1, 0, None, args, None),
              lambda: cuda.cuCtxSynchronize(),
              lambda: cuda.cuMemcpyDtoH_v2(host, dev, c_size_t(n * 4))]
    err = 0
    for step in steps:
        err = step()
        if err:
            break
    ms = round((time.perf_counter() - started) * 1000, 1)
    if err:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(err, byref(name))
        text = (name.value or b"?").decode()
        label = "no kernel image" if text == "CUDA_ERROR_NO_BINARY_FOR_GPU" else text
        print(json.dumps({"launch": f"{label} ({text})" if label != text else text,
                          "ran": False, "ms": ms}))
        return
    correct = all(v == 1.0 for v in host)
    print(json.dumps({"launch": "ran, result correct" if correct else "ran, WRONG result",
                      "ran": correct, "ms": ms}))


def torch_row(cc: Arch, cuobjdump: str, dry_run: bool) -> Row | None:
    """libtorch_cuda.so of the installed torch: verdict vs a real torch op on the GPU."""
    try:
        import torch
    except ImportError:
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if not library.is_file():
        return None
    code = list_device_code(library, cuobjdump)
    verdict = decide(code, cc)
    launch, ran, ms = "not launched (--dry-run)", None, None
    if not dry_run:
        snippet = ("import torch, time; t = time.perf_counter(); "
                   "x = torch.arange(1024, device='cuda', dtype=torch.float32); "
                   "y = (x * 2 + 1).sum().item(); torch.cuda.synchronize(); "
                   "print(y == 1024 * 1023 + 1024, round((time.perf_counter() - t) * 1000, 1))")
        done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                              timeout=300)
        if done.returncode == 0 and done.stdout.split()[0] == "True":
            launch, ran, ms = "ran, result correct", True, float(done.stdout.split()[1])
        else:
            launch, ran = "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:150], False
    return Row(f"torch {torch.__version__} libtorch_cuda.so", "(its wheel)",
               " ".join(a.sm for a in code.cubins), " ".join(a.compute for a in code.ptx),
               verdict, launch, ran, ms)


def table(rows: list[Row], cc: Arch, header: str) -> str:
    lines = [header, "",
             f"| case | nvcc -gencode | cubins (audit) | PTX (audit) | audit verdict for "
             f"{cc.sm} | launch on the GPU | first launch ms | agree |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        verdict = "n/a" if row.verdict is None else (
            row.verdict.coverage.value + (f" ({row.verdict.as_dict()['by']})"
                                          if row.verdict.by else ""))
        agree = {True: "yes", False: "**NO**", None: "n/a"}[row.agrees]
        ms = "" if row.ms is None else f"{row.ms:g}"
        lines.append(f"| {row.case} | `{row.targets}` | {row.cubins or '-'} | {row.ptx or '-'} "
                     f"| {verdict} | {row.launch} | {ms} | {agree} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    parser.add_argument("--dry-run", action="store_true", help="judge without launching")
    parser.add_argument("--cc", help="compute capability to judge for with --dry-run (9.0)")
    parser.add_argument("--no-torch", action="store_true", help="leave out libtorch_cuda.so")
    parser.add_argument("--launch", help=argparse.SUPPRESS)  # child modes
    parser.add_argument("--launch-driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.launch:
        launch_here(args.launch)
        return 0
    if args.launch_driver:
        launch_with_driver(args.launch_driver)
        return 0
    cc = Arch.parse(args.cc) if args.dry_run and args.cc else gpu_compute_capability()
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    nvcc_version, cuobjdump_version = tool_version(nvcc), tool_version(cuobjdump)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpu-coverage-") as tmp:
        source = Path(tmp) / "kernel.cu"
        source.write_text(KERNEL)
        cases = [(n, g, compile_case) for n, g in CASES] + \
            [(n, g, compile_embedded_case) for n, g in EMBEDDED_CASES]
        for index, (name, gencodes, build) in enumerate(cases):
            library = Path(tmp) / f"case{index}" / "lib.so"
            library.parent.mkdir()
            targets = " ".join(gencodes)
            error = build(nvcc, source, gencodes, library)
            if error:
                error = " ".join(error.split())
                rows.append(Row(name, targets, "", "", None, f"could not build it: {error}",
                                None, None))
                continue
            try:
                code = list_device_code(library, cuobjdump)
            except Exception as exc:  # keep going: one broken case must not hide the others
                rows.append(Row(name, targets, "", "", None, f"cuobjdump failed: {exc}"[:200],
                                None, None))
                continue
            verdict = decide(code, cc)
            outcome = ({"launch": "not launched (--dry-run)", "ran": None, "ms": None}
                       if args.dry_run else
                       launch_in_child(library, driver=build is compile_embedded_case))
            rows.append(Row(name, targets, " ".join(a.sm for a in code.cubins),
                            " ".join(a.compute for a in code.ptx), verdict, outcome["launch"],
                            outcome["ran"], outcome["ms"]))
        if not args.no_torch:
            try:
                row = torch_row(cc, cuobjdump, args.dry_run)
            except Exception as exc:
                print(f"torch case left out: {exc}", file=sys.stderr)
                row = None
            if row is not None:
                rows.append(row)
    gpu = "" if args.dry_run else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    header = (f"GPU: {gpu or 'none (dry run)'}; judged for {cc.sm} (compute capability "
              f"{cc.major}.{cc.minor}); {nvcc_version}; {cuobjdump_version}")
    text = table(rows, cc, header)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    judged = [r for r in rows if r.agrees is not None]
    disagreements = [r.case for r in judged if not r.agrees]
    if disagreements:
        print(f"DISAGREE: {', '.join(disagreements)}", file=sys.stderr)
        return 1
    if not judged and not args.dry_run:
        print("nothing could be judged against a launch", file=sys.stderr)
        return 2
    print(f"{len(judged)} cases: the audit's verdict matches the driver in every one"
          if judged else "dry run: verdicts only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
