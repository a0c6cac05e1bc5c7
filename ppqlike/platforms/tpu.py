"""TPU-MLIR BM1684X style (TPU_INT8).

Symmetric int8 activations and per-channel weights, int32 bias, rounding
half away from zero (C ``round``), requantization by integer multiplier and
right shift, KL calibration.
"""

from ..core.quant import RoundingPolicy
from .quantizer import PlatformPolicy, TensorPolicy
from .target import TargetPlatform

TPU_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.TPU_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, signed=True, observer="kl"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, narrow_range=True),
    rounding=RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
    bias_int32=True,
    integer_requantization=True,
    exporter="tpu_mlir",
    description="TPU-MLIR: symmetric int8, per-channel weights, int32 bias, integer multiplier/shift requant",
)
