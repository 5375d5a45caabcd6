# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import torch

torch_release = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])
