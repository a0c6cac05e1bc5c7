"""onnxruntime CPU QDQ (ORT_INT8).

uint8 asymmetric activations per tensor (what onnxruntime's x86 integer
kernels fuse best), int8 symmetric per-channel weights, int32 bias,
half-to-even rounding like QuantizeLinear.  The simulation computes Conv,
MatMul, Gemm, Add, Mul and GlobalAveragePool as onnxruntime's integer kernels do
(``runtime_kernels='onnxruntime'``), so it matches the deployed model.
Transformers: attention MatMuls and residual Adds run as its integer kernels;
LayerNorm, GELU and Softmax stay float (its QLinearSoftmax would compute a
lookup table the simulation does not).  Recurrent ops (LSTM, GRU, RNN) stay
float: its static QDQ quantizer leaves LSTM float (its integer LSTM is the
dynamically quantized com.microsoft DynamicQuantizeLSTM, another format), and
its CPU GRU/RNN kernels are float only; Q/DQ sit at their boundaries.
"""

from .quantizer import PlatformPolicy, TensorPolicy, TransformerPolicy
from .target import TargetPlatform

ORT_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.ORT_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=False, signed=False, observer="minmax"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, narrow_range=True),
    bias_int32=True,
    runtime_kernels="onnxruntime",
    higher_precision_bits=16,  # int16 QDQ (opset 21): onnxruntime runs such layers in float between them
    exporter="qdq_onnx",
    transformer=TransformerPolicy(layer_norm="float", gelu="float", softmax="float", attention_matmul="quantize",
                                  residual_add="quantize", embedding="float"),
    description="onnxruntime CPU: uint8 asymmetric activations, per-channel int8 weights, int32 bias",
)
