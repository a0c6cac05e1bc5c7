"""Academic platforms: every quantizable op, plain min-max (ACADEMIC_INT8), 4-bit weights (ACADEMIC_W4A8), 4-bit
activations and weights (ACADEMIC_INT4), and int4 with int8 as its higher precision (ACADEMIC_MIX: PPQ's mixed
int4/int8 platform; the layer protection and the accuracy target move layers to int8 before FP32).

Used to compare algorithms, not to deploy: all ops the quantizer knows are
quantized, activations asymmetric uint8, 8-bit weights symmetric per channel, 4-bit weights asymmetric per
channel on ACADEMIC_W4A8.
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

#: 4-bit weights asymmetric per channel (a zero point per output channel, codes -8..7), the convention of the
#: block-reconstruction literature (BRECQ, QDrop): 16 levels placed on each channel's [min, max] instead of 15
#: around zero, which a depthwise filter of 9 skewed weights needs.  Chosen on calibration images (100
#: calibrate, the other 100 measure; `best`, logits cosine / top-1 agreement, symmetric narrow -> asymmetric):
#: MobileNetV2 0.925/0.77 -> 0.947/0.87, EfficientNet-Lite0 0.905/0.82 -> 0.927/0.85, SqueezeNet 0.946/0.81 ->
#: 0.944/0.78 (symmetric over the full [-8, 7]: 0.918/0.75, 0.911/0.84, 0.926/0.81).  Dev images, top-1 (FP32
#: 0.843 / 0.900 / 0.617): 0.817 -> 0.810, 0.847 -> 0.863, 0.573 -> 0.593 (docs/BENCHMARKS.md, round 15).
ACADEMIC_W4A8_POLICY = ACADEMIC_INT8_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_W4A8,
    weight=TensorPolicy(num_of_bits=4, symmetric=False, per_channel=True),
    higher_precision_bits=8,   # the layers the protection or the accuracy target picks: 8-bit weights
    description="academic: 4-bit asymmetric per-channel weights, 8-bit activations (the protected layers' "
                "weights 8-bit)")

ACADEMIC_INT4_POLICY = ACADEMIC_INT8_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_INT4,
    activation=TensorPolicy(num_of_bits=4, symmetric=False, signed=False, observer="mse"),
    weight=TensorPolicy(num_of_bits=4, symmetric=True, per_channel=True, narrow_range=True),
    description="academic: every quantizable op, asymmetric uint4 activations (MSE ranges), per-channel int4 weights")

ACADEMIC_MIX_POLICY = ACADEMIC_INT4_POLICY.with_changes(
    platform=TargetPlatform.ACADEMIC_MIX, higher_precision_bits=8,
    description="academic mixed int4/int8: int4, the layers the protection or the accuracy target picks in int8")
