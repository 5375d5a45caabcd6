# infermatrix shim (scripts/gdn_engine_kernels.py): not from the wheel.
# replaces the wheel's ops/__init__.py: only the GDN ops the check runs
from .chunk import chunk_gated_delta_rule
from .fused_recurrent import fused_recurrent_gated_delta_rule
from .fused_sigmoid_gating import fused_sigmoid_gating_delta_rule_update
