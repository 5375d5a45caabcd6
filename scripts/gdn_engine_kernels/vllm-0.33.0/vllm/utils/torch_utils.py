# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import torch


def async_tensor_h2d(data, device=None, dtype=None, out=None):
    # vllm 0.33.0 utils/torch_utils.py without the pinned staging buffer
    if dtype is None and out is not None:
        dtype = out.dtype
    t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    if out is not None:
        return out.copy_(t, non_blocking=True)
    return t.to(device=device, dtype=dtype, non_blocking=True)
