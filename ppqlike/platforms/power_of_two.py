"""Power-of-2 platforms: TI TIDL (TIDL_INT8) and NXP (NXP_INT8).

Symmetric per-tensor int8 with scales 2^-n, so rescaling is a shift.  TIDL
rounds half to even and calibrates with percentile-clipped ranges; NXP rounds
half up.  The two differ in those two settings only.  Recurrent ops (LSTM,
GRU, RNN) stay float, as on every built-in platform (``PlatformPolicy.recurrent``).
"""

from ..core.quant import RoundingPolicy
from .quantizer import PlatformPolicy, TensorPolicy
from .target import TargetPlatform

TIDL_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.TIDL_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, signed=True, power_of_2=True, observer="percentile"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=False, narrow_range=True, power_of_2=True),
    bias_int32=True,
    add_alignment="larger",
    higher_precision_bits=16,  # TIDL runs chosen layers in 16 bits (its params16bitNamesList)
    exporter="qdq_onnx",
    description="TIDL: power-of-2 symmetric per-tensor int8",
)

NXP_INT8_POLICY = TIDL_INT8_POLICY.with_changes(
    platform=TargetPlatform.NXP_INT8, rounding=RoundingPolicy.ROUND_HALF_UP, higher_precision_bits=None,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, signed=True, power_of_2=True, observer="minmax"),
    description="NXP: power-of-2 symmetric per-tensor int8, rounding half up")
