"""TPU-MLIR BM1684X style (TPU_INT8).

Symmetric int8 activations (unsigned [0, 255] with zero point 0 where the calibration minimum is >= 0:
TPU-MLIR's lowering, getQuantInt8Type, makes such tensors uint8) and per-channel weights, int32 bias, rounding
half away from zero (C ``round``), requantization by integer multiplier and
right shift, KL calibration.  Transformers: TPU-MLIR's all-int8 lowering for
BM1684X (LayerNorm in F16, Softmax in F32, GELU as a 256-entry lookup table,
attention MatMuls and residual Adds in int8: the transformer policy below)
keeps MiniLM-L6 at 0.74 embedding cosine, so a graph with LayerNorms takes the
mixed precision TPU-MLIR's quantize table expresses (``transformer_placement``):
int8 MatMuls but the probabilities x V (F32, as every other op listed in the
qtable; 0.997 with SmoothQuant's Muls in front of the MatMuls).  Recurrent ops
(LSTM, GRU) stay float: TPU-MLIR's int8 lowering of LSTM and GRU for BM1684X
emits the F32 op (the quantize table lists their outputs F32).  Higher precision: the accuracy target and the layer protection move a layer to BF16 first
(TPU-MLIR's quantize table mode ``BF16``: activations and weights cast to bfloat16, bias float; the layer's
readers cast back to int8 with its int8 threshold), FP32 after it where BF16 is not enough.  TPU_BF16 and
TPU_F16 are the whole-model modes (every op BF16 / F16: ``model_deploy.py --quantize BF16``).
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
    higher_precision_bits="BF16",
    exporter="tpu_mlir",
    transformer_placement="compute_inputs",
    transformer=TransformerPolicy(layer_norm="float", gelu="quantize", softmax="float", attention_matmul="quantize",
                                  probability_matmul="float", residual_add="quantize", embedding="float"),
    description="TPU-MLIR: symmetric int8, per-channel weights, int32 bias, integer multiplier/shift requant",
)


def _whole_model(platform: TargetPlatform, fmt: str, mode: str) -> PlatformPolicy:
    from .quantizer import DEFAULT_QUANTIZABLE_TYPES
    return TPU_INT8_POLICY.with_changes(
        platform=platform, rounding=RoundingPolicy.ROUND_HALF_EVEN, bias_int32=False, integer_requantization=False,
        higher_precision_bits=None, transformer_placement=None, placement="every_output",
        activation=TensorPolicy(num_of_bits=16, symmetric=True, observer="unit", float_format=fmt),
        weight=TensorPolicy(num_of_bits=16, symmetric=True, observer="unit", float_format=fmt),
        quantizable_types=DEFAULT_QUANTIZABLE_TYPES | {"Softmax", "LayerNormalization", "Sigmoid", "Mul", "Div",
                                                       "Sub", "ReduceMean", "Resize"},
        transformer=TransformerPolicy(layer_norm="quantize", gelu="quantize", softmax="quantize",
                                      attention_matmul="quantize", residual_add="quantize", embedding="float"),
        description=f"TPU-MLIR {mode} mode: every op's activations and weights in {mode}, bias float")


TPU_BF16_POLICY = _whole_model(TargetPlatform.TPU_BF16, "BF16", "BF16")
TPU_F16_POLICY = _whole_model(TargetPlatform.TPU_F16, "FP16", "F16")
