"""TPU-MLIR BM1684X style (TPU_INT8).

Symmetric int8 activations (unsigned [0, 255] with zero point 0 where the calibration minimum is >= 0:
TPU-MLIR's lowering, getQuantInt8Type, makes such tensors uint8) and per-channel weights, int32 bias, rounding
half away from zero (C ``round``), requantization by integer multiplier and
right shift, KL calibration.  Transformers: TPU-MLIR's all-int8 lowering for
BM1684X (LayerNorm in F16, Softmax in F32, GELU as a 256-entry lookup table,
attention MatMuls and residual Adds in int8: the transformer policy below)
keeps MiniLM-L6 at 0.74 embedding cosine, so a graph with LayerNorms takes the
mixed precision TPU-MLIR's quantize table expresses (``transformer_placement``):
int8 MatMuls, every other op listed F32 in the qtable (0.997 with
SmoothQuant's Muls in front of the MatMuls).  Recurrent ops (LSTM, GRU) stay float: TPU-MLIR's int8 lowering of
LSTM and GRU for BM1684X emits the F32 op (the quantize table lists their
outputs F32).
"""

from ..core.quant import RoundingPolicy
from .quantizer import PlatformPolicy, TensorPolicy, TransformerPolicy
from .target import TargetPlatform

TPU_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.TPU_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, signed=True, observer="kl", unsigned_non_negative=True),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, narrow_range=True),
    rounding=RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
    bias_int32=True,
    integer_requantization=True,
    exporter="tpu_mlir",
    transformer_placement="compute_inputs",
    transformer=TransformerPolicy(layer_norm="float", gelu="quantize", softmax="float", attention_matmul="quantize",
                                  residual_add="quantize", embedding="float"),
    description="TPU-MLIR: symmetric int8, per-channel weights, int32 bias, integer multiplier/shift requant",
)
