"""onnxruntime CPU QDQ (ORT_INT8).

uint8 asymmetric activations per tensor (what onnxruntime's x86 integer
kernels fuse best), int8 symmetric per-channel weights, int32 bias,
half-to-even rounding like QuantizeLinear.  The simulation computes Conv,
MatMul, Gemm, Add, Mul and GlobalAveragePool as onnxruntime's integer kernels do
(``runtime_kernels='onnxruntime'``), so it matches the deployed model.
Transformers (a graph with LayerNorms) take TensorRT's placement
(``transformer_placement``): only what MatMuls read is quantized, which
onnxruntime runs as MatMulIntegerToFloat, and LayerNorm, GELU, Softmax and
the residual Adds stay float, as its dynamic quantization of transformers
does: MiniLM-L6 0.861 -> 0.990 embedding cosine (every output quantized ->
MatMul inputs only), 0.998 with SmoothQuant in front of every MatMul.  The
simulation computes those MatMuls in float on the dequantized inputs: equal
to onnxruntime's up to float rounding, not bit for bit as the CNN chains.  Recurrent ops (LSTM, GRU, RNN) stay
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
    # so a front of the graph (many layers) is faster, and exact, in FP32: MobileNetV2 `best`, 8-op front, INT16
    # -> FP32: 0.72x -> 1.02x FP32 throughput deployed, SNR 24.7 -> 25.0 dB (docs/BENCHMARKS.md, round 16)
    wider_grid_runs_float=True,
    exporter="qdq_onnx",
    transformer_placement="compute_inputs",
    transformer=TransformerPolicy(layer_norm="float", gelu="float", softmax="float", attention_matmul="quantize",
                                  probability_matmul="float", residual_add="quantize", embedding="float"),
    description="onnxruntime CPU: uint8 asymmetric activations, per-channel int8 weights, int32 bias",
)
