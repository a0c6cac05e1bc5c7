"""Floating-point platforms: TensorRT FP8 (TRT_FP8), Graphcore FP8 (GRAPHCORE_FP8), and the academic FP8,
FP16 and BF16 platforms (FP8, FP16, BF16).

Their grids are floating-point formats (``ppqlike.core.float_formats``): q = cast(x / S), r = q * S.

* TRT_FP8: what TensorRT's explicit FP8 quantization runs (as ModelOpt exports it): FP8 E4M3 activations per
  tensor with S = amax / 448, E4M3 weights per output channel, bias float; Q/DQ placed as TRT_INT8 places
  them (the inputs of Conv/Gemm/MatMul and the skip input of a residual Add fused into a conv's epilogue;
  ``optim.passes.placement``); transformers as TRT_INT8 (attention MatMuls on the grid, LayerNorm, GELU,
  Softmax and residual Adds in float).
* GRAPHCORE_FP8: the IPU's FP8 (as PPQ's GraphCore quantizer describes it): E4M3 with power-of-2 scales (the
  IPU's FP8 "scale bias" is an integer exponent), per tensor for activations and per channel for weights, on
  every op of PPQ's list for it (convolutions, GEMMs, pooling, element-wise ops, shape ops, Resize), every
  output quantized, bias float.
* FP8 (academic): every quantizable op, E4M3 activations per tensor, weights per channel, S = amax / 448.
* FP16 / BF16 (academic): every quantizable op's activations and weights cast to half / bfloat16 with scale 1
  (round to nearest even; a value past the format's range becomes Inf, as a Cast does).

Exported as QDQ ONNX at opset 19 (``export.qdq``): FP8 configs as QuantizeLinear/DequantizeLinear with
float8e4m3fn zero points, FP16/BF16 configs as a pair of Casts, which onnxruntime runs on its CPU provider
equal to the simulation bit for bit (float8 QuantizeLinear/DequantizeLinear and float16/bfloat16 Cast are
CPU kernels of onnxruntime 1.32).
"""

from .academic import ACADEMIC_INT8_POLICY
from .quantizer import DEFAULT_QUANTIZABLE_TYPES, PlatformPolicy, TensorPolicy
from .target import TargetPlatform
from .tensorrt import TRT_INT8_POLICY

_E4M3_ACTIVATION = TensorPolicy(num_of_bits=8, symmetric=True, signed=True, observer="minmax", float_format="E4M3FN")
_E4M3_WEIGHT = TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, observer="minmax", float_format="E4M3FN")

TRT_FP8_POLICY = TRT_INT8_POLICY.with_changes(
    platform=TargetPlatform.TRT_FP8, activation=_E4M3_ACTIVATION, weight=_E4M3_WEIGHT, bias_int32=False,
    description="TensorRT FP8: E4M3 activations per tensor (amax / 448), E4M3 weights per channel, float bias, "
                "TensorRT's Q/DQ placement")

GRAPHCORE_FP8_POLICY = PlatformPolicy(
    platform=TargetPlatform.GRAPHCORE_FP8,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, power_of_2=True, observer="minmax", float_format="E4M3FN"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, power_of_2=True, float_format="E4M3FN"),
    quantizable_types=frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Relu", "PRelu", "Clip", "Resize",
                                 "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool", "Mul", "Add",
                                 "LeakyRelu", "Split", "Concat", "Transpose", "Slice", "Reshape", "Flatten",
                                 "Sigmoid", "ReduceMean"}),
    fused_activations=frozenset({"Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid"}),
    bias_int32=False,
    exporter="qdq_onnx",
    transformer=ACADEMIC_INT8_POLICY.transformer,
    description="Graphcore IPU FP8: E4M3 with power-of-2 scales, per-tensor activations, per-channel weights",
)

FP8_POLICY = ACADEMIC_INT8_POLICY.with_changes(
    platform=TargetPlatform.FP8, activation=_E4M3_ACTIVATION, weight=_E4M3_WEIGHT, bias_int32=False,
    description="academic FP8: every quantizable op, E4M3 activations per tensor, E4M3 weights per channel")


def _unscaled(platform: TargetPlatform, fmt: str, what: str) -> PlatformPolicy:
    return ACADEMIC_INT8_POLICY.with_changes(
        platform=platform, bias_int32=False,
        activation=TensorPolicy(num_of_bits=16, symmetric=True, observer="unit", float_format=fmt),
        weight=TensorPolicy(num_of_bits=16, symmetric=True, observer="unit", float_format=fmt),
        quantizable_types=DEFAULT_QUANTIZABLE_TYPES | ACADEMIC_INT8_POLICY.quantizable_types,
        description=f"academic {what}: every quantizable op's activations and weights cast to {what} (scale 1)")


FP16_POLICY = _unscaled(TargetPlatform.FP16, "FP16", "FP16")
BF16_POLICY = _unscaled(TargetPlatform.BF16, "BF16", "BF16")
