"""TensorRT INT8 (TRT_INT8) and PPL CUDA INT8 (PPL_CUDA_INT8).

Symmetric int8 activations per tensor, symmetric narrow-range per-channel
weights, half-to-even rounding, bias kept float (TensorRT folds it in FP32),
Conv/Gemm fused with Relu/Clip, Concat inputs aligned.  Placement as
TensorRT's explicit quantization runs best (``optim.passes.placement``):
Q/DQ on the inputs of Conv/Gemm/MatMul and on the skip input of a residual
Add fused into a conv's epilogue, everything else (and the outputs) float.  Transformers: TensorRT
runs LayerNorm, GELU (fused into the GEMM epilogue), Softmax and residual Adds
in float where no Q/DQ pair asks otherwise, and runs the attention MatMuls in int8
when their inputs are quantized: Q K^T is, the probabilities x V is not (it runs in
float, as NNCF's transformer mode leaves it: an 8-bit grid over a probability row
either rounds the small weights of a diffuse head to zero or clips the peak of a
sharp one; the ViT-S's worst dev image 0.898 -> 0.984, docs/TRANSFORMERS.md).
PPL CUDA differs only in quantizing the bias to int32 and aligning Add inputs to the
output.  PPL_CUDA_INT4 is PPL CUDA with symmetric int4 activations and weights; PPL_CUDA_MIX is int4 with int8 as its higher precision (PPQ's mixed
platform: the layer protection and the accuracy target move layers to int8 before FP32).
Recurrent ops (LSTM, GRU, RNN) stay float: onnx-tensorrt imports them as
loops in FP32/FP16 only (its operator support matrix lists no INT8 for them),
so Q/DQ sit only where their neighbours are quantized.
"""

from .quantizer import PlatformPolicy, TensorPolicy, TransformerPolicy
from .target import TargetPlatform

TRT_INT8_POLICY = PlatformPolicy(
    platform=TargetPlatform.TRT_INT8,
    activation=TensorPolicy(num_of_bits=8, symmetric=True, signed=True, observer="kl"),
    weight=TensorPolicy(num_of_bits=8, symmetric=True, per_channel=True, narrow_range=True),
    bias_int32=False,
    exporter="qdq_onnx",
    placement="compute_inputs",
    transformer=TransformerPolicy(layer_norm="float", gelu="float", softmax="float", attention_matmul="quantize",
                                  probability_matmul="float", residual_add="float", embedding="float"),
    description="TensorRT: int8 symmetric activations (per tensor) where int8 kernels read them, per-channel int8 "
                "weights, float bias",
)

PPL_CUDA_INT8_POLICY = TRT_INT8_POLICY.with_changes(
    platform=TargetPlatform.PPL_CUDA_INT8, bias_int32=True, add_alignment="output", placement="every_output",
    description="PPL CUDA: as TensorRT, with int32 bias and Add inputs aligned to the output")

PPL_CUDA_INT4_POLICY = PPL_CUDA_INT8_POLICY.with_changes(
    platform=TargetPlatform.PPL_CUDA_INT4,
    activation=TensorPolicy(num_of_bits=4, symmetric=True, signed=True, observer="mse"),
    weight=TensorPolicy(num_of_bits=4, symmetric=True, per_channel=True, narrow_range=True),
    description="PPL CUDA int4: symmetric int4 activations (MSE ranges), per-channel int4 weights, int32 bias")

PPL_CUDA_MIX_POLICY = PPL_CUDA_INT4_POLICY.with_changes(
    platform=TargetPlatform.PPL_CUDA_MIX, higher_precision_bits=8,
    description="PPL CUDA mixed int4/int8: int4, the layers the protection or the accuracy target picks in int8")
