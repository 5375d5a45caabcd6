# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
import torch


class _CudaPlatform:
    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_device_capability_family(self, family, device_id=0):
        return torch.cuda.get_device_capability(device_id)[0] * 10 == family

    def is_arch_support_pdl(self):
        return torch.cuda.get_device_capability()[0] >= 9

    def __getattr__(self, name):
        raise AttributeError(f'infermatrix shim: current_platform.{name} is not '
                             'shimmed')


current_platform = _CudaPlatform()
