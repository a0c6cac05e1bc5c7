"""Academic platforms: every quantizable op, plain min-max (ACADEMIC_INT8), 4-bit weights (ACADEMIC_W4A8), 4-bit
activations and weights (ACADEMIC_INT4), and int4 with int8 as its higher precision (ACADEMIC_MIX: PPQ's mixed
int4/int8 platform; the layer protection and the accuracy target move layers to int8 before FP32).

Used to compare algorithms, not to deploy: all ops the quantizer knows are
quantized, activations asymmetric uint8, weights symmetric per channel.
Transformer blocks as the W8A8 setting of the literature (SmoothQuant, LLM.int8 baselines): the linear
layers and the attention MatMuls in int8; LayerNorm, GELU, Softmax and residual Adds in float.
Recurrent ops (LSTM, GRU, RNN) stay float, as on every built-in platform (``PlatformPolicy.recurrent``).
"""

from .quantizer import DEFAULT_QUANTIZABLE_TYPES, PlatformPolicy, TensorPolicy, TransformerPolicy
from .target import TargetPlatform

ACADEMIC_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.ACADEMIC_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=False, signed=False, observer="minmax"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, narrow_range=True),
    quantizable_types=DEFAULT_QUANTIZABLE_TYPES | {"Softmax", "Sigmoid", "Mul", "Div", "Sub", "ReduceMean",
                                                   "LayerNormalization", "Resize"},
    bias_int32=True,
    exporter="qdq_onnx",
    transformer=TransformerPolicy(layer_norm="float", gelu="float", softmax="float", attention_matmul="quantize",
                                  residual_add="float", embedding="float"),
    description="academic: every quantizable op, asymmetric uint8 activations, per-channel int8 weights",
)

ACADEMIC_W4A8_POLICY = ACADEMIC_INT8_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_W4A8,
    weight=TensorPolicy(num_of_bits=4, symmetric=True, per_channel=True, narrow_range=True),
    higher_precision_bits=8,   # the layers the protection or the accuracy target picks: 8-bit weights
    description="academic: 4-bit per-channel weights, 8-bit activations (the protected layers' weights 8-bit)")

ACADEMIC_INT4_POLICY = ACADEMIC_INT8_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_INT4,
    activation=TensorPolicy(num_of_bits=4, symmetric=False, signed=False, observer="mse"),
    weight=TensorPolicy(num_of_bits=4, symmetric=True, per_channel=True, narrow_range=True),
    description="academic: every quantizable op, asymmetric uint4 activations (MSE ranges), per-channel int4 weights")

ACADEMIC_MIX_POLICY = ACADEMIC_INT4_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_MIX, higher_precision_bits=8,
    description="academic mixed int4/int8: int4, the layers the protection or the accuracy target picks in int8")
