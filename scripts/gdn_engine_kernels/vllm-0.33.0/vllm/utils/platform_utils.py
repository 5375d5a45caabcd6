# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import torch


def num_compute_units(device_id=0):
    return torch.cuda.get_device_properties(device_id).multi_processor_count
