# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
