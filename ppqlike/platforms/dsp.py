"""DSP style (DSP_INT8): asymmetric uint8 per-tensor weights and activations.

The hardest common target: per-tensor asymmetric weights lose accuracy on
depthwise convolutions (cross-layer equalization helps).  Recurrent ops (LSTM,
GRU, RNN) stay float, as on every built-in platform (``PlatformPolicy.recurrent``).
"""

from .quantizer import PlatformPolicy, TensorPolicy
from .target import TargetPlatform

DSP_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.DSP_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=False, signed=False, observer="minmax"),
    weight=TensorPolicy(num_of_bits=8, symmetric=False, signed=False, per_channel=False),
    bias_int32=True,
    add_alignment="none",
    higher_precision_bits=16,  # A16 layers (QNN/SNPE run 16-bit activations and weights)
    exporter="qdq_onnx",
    description="DSP: asymmetric uint8 per-tensor weights and activations, int32 bias",
)
