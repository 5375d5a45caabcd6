# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice
