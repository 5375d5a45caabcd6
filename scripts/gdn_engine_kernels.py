#!/usr/bin/env python3
"""Extract the engines' own Gated DeltaNet Triton kernels from their wheels, to run standalone.

The cells run vLLM 0.33.0 and SGLang 0.5.23; their GDN ops are pure-Python Triton files inside
the wheels:
  vllm 0.33.0    vllm/third_party/flash_linear_attention/ (LICENSE: MIT, files Apache-2.0 headers)
  sglang 0.5.23  sglang/kernels/ops/attention/fla/        (the wheel: Apache-2.0)
This script copies those folders unchanged (headers and LICENSE kept) into
  <out>/vllm-0.33.0/vllm/third_party/flash_linear_attention/...
  <out>/sglang-0.5.23/sglang/kernels/ops/attention/fla/...
and writes the few small modules they import from the rest of the engine as shims (marked
"infermatrix shim"; listed in SHIMS below), so `import vllm.third_party.flash_linear_attention.ops`
works on a host with only torch + triton (+ einops for sglang). One file of vLLM is replaced:
ops/__init__.py (the wheel's also imports RMSNormGated, fused_post_conv_prep and others, which need
vllm's warm-up machinery) by one that imports chunk_gated_delta_rule,
fused_recurrent_gated_delta_rule and fused_sigmoid_gating_delta_rule_update only. The sglang
package __init__ files above fla/ (imports of the whole kernel registry) are shims too; fla/
itself has none in the wheel.

Usage (the wheels from `pip download --no-deps vllm==0.33.0 sglang==0.5.23`; their sha256 are
checked):
  python3 scripts/gdn_engine_kernels.py --vllm-wheel vllm-0.33.0-...whl \
      --sglang-wheel sglang-0.5.23-...whl --out scripts/gdn_engine_kernels
The files the check needs are committed under scripts/gdn_engine_kernels/ (the rest is ignored:
scripts/gdn_engine_kernels/.gitignore), so the GPU host (no network) gets them with the tree;
scripts/gdn_device_check.py runs the harness's GDN check against them.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

WHEELS = {
    "vllm-0.33.0": {
        "sha256": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
        "name": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "folder": "vllm/third_party/flash_linear_attention/",
    },
    "sglang-0.5.23": {
        "sha256": "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
        "name": "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
        "folder": "sglang/kernels/ops/attention/fla/",
    },
}

SHIM = "# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.\n"

SHIMS: dict[str, dict[str, str]] = {
    "vllm-0.33.0": {
        "vllm/__init__.py": "",
        "vllm/third_party/__init__.py": "",
        "vllm/third_party/flash_linear_attention/ops/__init__.py": (
            "# replaces the wheel's ops/__init__.py: only the GDN ops the check runs\n"
            "from .chunk import chunk_gated_delta_rule\n"
            "from .fused_recurrent import fused_recurrent_gated_delta_rule\n"
            "from .fused_sigmoid_gating import fused_sigmoid_gating_delta_rule_update\n"),
        "vllm/triton_utils/__init__.py": (
            "import triton\n"
            "import triton.language as tl\n"
            "import triton.language.extra.libdevice as tldevice\n"),
        "vllm/platforms/__init__.py": (
            "import torch\n\n\n"
            "class _CudaPlatform:\n"
            "    def is_cuda(self):\n        return True\n\n"
            "    def is_cuda_alike(self):\n        return True\n\n"
            "    def is_rocm(self):\n        return False\n\n"
            "    def is_xpu(self):\n        return False\n\n"
            "    def is_device_capability_family(self, family, device_id=0):\n"
            "        return torch.cuda.get_device_capability(device_id)[0] * 10 == family\n\n"
            "    def is_arch_support_pdl(self):\n"
            "        return torch.cuda.get_device_capability()[0] >= 9\n\n"
            "    def __getattr__(self, name):\n"
            "        raise AttributeError(f'infermatrix shim: current_platform.{name} is not '\n"
            "                             'shimmed')\n\n\n"
            "current_platform = _CudaPlatform()\n"),
        "vllm/utils/__init__.py": "",
        "vllm/utils/gpu_sync_debug.py": (
            "import contextlib\n\n\n"
            "def gpu_sync_allowed(first_only=False):\n"
            "    return contextlib.nullcontext()\n"),
        "vllm/utils/torch_utils.py": (
            "import torch\n\n\n"
            "def async_tensor_h2d(data, device=None, dtype=None, out=None):\n"
            "    # vllm 0.33.0 utils/torch_utils.py without the pinned staging buffer\n"
            "    if dtype is None and out is not None:\n"
            "        dtype = out.dtype\n"
            "    t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)\n"
            "    if out is not None:\n"
            "        return out.copy_(t, non_blocking=True)\n"
            "    return t.to(device=device, dtype=dtype, non_blocking=True)\n"),
        "vllm/utils/math_utils.py": (
            "import math\n\nRCP_LN2 = 1.0 / math.log(2.0)\n\n\n"
            "def cdiv(a, b):\n    return -(a // -b)\n\n\n"
            "def next_power_of_2(n):\n    return 1 if n <= 0 else 1 << (n - 1).bit_length()\n"),
        "vllm/utils/platform_utils.py": (
            "import torch\n\n\n"
            "def num_compute_units(device_id=0):\n"
            "    return torch.cuda.get_device_properties(device_id).multi_processor_count\n"),
    },
    "sglang-0.5.23": {
        "sglang/__init__.py": "",
        "sglang/kernels/__init__.py": "",
        "sglang/kernels/ops/__init__.py": "",
        "sglang/kernels/ops/attention/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/utils/__init__.py": "",
        "sglang/srt/utils/common.py": (
            "import torch\n\n"
            "torch_release = tuple(int(x) for x in "
            "torch.__version__.split('+')[0].split('.')[:2])\n"),
    },
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(engine: str, wheel: Path, out: Path) -> list[str]:
    spec = WHEELS[engine]
    got = sha256(wheel)
    if got != spec["sha256"]:
        raise SystemExit(f"{wheel}: sha256 {got}, expected {spec['sha256']} ({spec['name']})")
    root = out / engine
    if root.exists():
        shutil.rmtree(root)
    written = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(spec["folder"]) and not name.endswith("/"):
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
                written.append(name)
    for name, text in SHIMS[engine].items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(SHIM + text)
        written.append(f"{name} (shim)")
    (root / "SOURCE.txt").write_text(
        f"{spec['name']} sha256 {spec['sha256']}\nfolder {spec['folder']} copied unchanged, "
        f"except the shims (first line '{SHIM.strip()}'):\n"
        + "".join(f"  {n}\n" for n in SHIMS[engine]))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-wheel", type=Path)
    parser.add_argument("--sglang-wheel", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "gdn_engine_kernels")
    args = parser.parse_args(argv)
    for engine, wheel in (("vllm-0.33.0", args.vllm_wheel), ("sglang-0.5.23", args.sglang_wheel)):
        if wheel is None:
            continue
        files = extract(engine, wheel, args.out)
        print(f"{engine}: {len(files)} files -> {args.out / engine}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
