# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import math

RCP_LN2 = 1.0 / math.log(2.0)


def cdiv(a, b):
    return -(a // -b)


def next_power_of_2(n):
    return 1 if n <= 0 else 1 << (n - 1).bit_length()
