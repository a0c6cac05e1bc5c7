"""An expansion chain of onnxruntime integer kernels run as one kernel, on codes.

A quantized MobileNet block's 1x1 expansion (QLinearConv, its Relu/Clip folded
into the quantization range) and the depthwise QLinearConv reading it run as
``ops._conv_channels_last.expand_then_depthwise`` runs the float pair, a group
of images at a time: the GEMM on the input's codes, the requantization of each
block while it is in cache (``requantize_block``), the depthwise convolution on
those codes, its requantization, so that the expanded activation - neither its
accumulator nor its codes - never goes to memory whole.  The result is the
second conv's codes (``integer_codes.Codes``).

Equal bit for bit to the two integer kernels run one after the other
(``onnxruntime_kernels``): every partial sum is an integer below 2^24, exact in
float32 in any order (a conv whose sums may not be is not chained), and the
requantization is the same elementwise float32 arithmetic.  Reads configs;
writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ir import Operation
from ..core.quant import TensorQuantizationConfig
from .integer_codes import Codes, code_bound, integer_codes, largest_magnitude, per_tensor
from .onnxruntime_kernels import (EXACT_F32, activation_fused, applied_root, channel_multiplier, clamp_codes,
                                  product_bound)
from .ops._conv_channels_last import expand_then_depthwise
from .simulation import grid_key

_F32 = np.float32


@dataclass(frozen=True)
class ConvCodes:
    """What one integer Conv of a chain computes with: its weight and bias codes (float32 integers),
    the requantization multiplier per output channel, the codes its result is clamped to, and the
    config its result's codes belong to."""
    weight: np.ndarray
    bias: np.ndarray | None
    multiplier: np.ndarray
    low: float
    high: float
    output: TensorQuantizationConfig


def conv_codes(operation: Operation, arguments: list, edges: np.ndarray | None) -> ConvCodes | None:
    """``ConvCodes`` of a Conv marked for onnxruntime's kernel, from its weight and bias after their
    input configs (``arguments[1:]``); ``edges``: a fused Relu/Clip's (``fusion.grid_edges``).  None
    when the chain cannot compute it exactly in float32 (then the ops run one by one)."""
    config = operation.config
    configs = [applied_root(c) for c in config.input_quantization_config]
    output = applied_root(config.output_quantization_config[0])
    if output is None or not per_tensor(output) or np.asarray(output.scale).dtype != _F32 \
            or output.num_of_bits > 8 or len(configs) < 2 or configs[0] is None or configs[1] is None \
            or not per_tensor(configs[0]) or any(c is not None and c.num_of_bits > 8 for c in configs[:2]):
        return None
    if edges is None and activation_fused(operation):
        return None   # its activation is not folded into the clamp
    weight = integer_codes(configs[1], arguments[1])
    bias = None
    if len(arguments) > 2 and arguments[2] is not None:
        if len(configs) < 3 or configs[2] is None:
            return None
        bias = integer_codes(configs[2], np.asarray(arguments[2], np.float64))
        if bias is None:
            return None
    if weight is None or weight.dtype != _F32 or np.size(configs[1].scale) not in (1, weight.shape[0]):
        return None
    products = product_bound(operation, [None, weight], code_bound(configs[0]))
    if products + (largest_magnitude(bias) if bias is not None else 0.0) >= EXACT_F32:
        return None
    multiplier = channel_multiplier(configs[0].scale, configs[1].scale, output.scale)
    multiplier = np.broadcast_to(multiplier, (weight.shape[0],)).astype(_F32)
    low, high = clamp_codes(output, edges)
    return ConvCodes(weight, None if bias is None else bias.astype(_F32).reshape(-1), multiplier, low, high,
                     output)


def requantize_block(multiplier: np.ndarray, low: float, high: float, width: int):
    """The in-cache requantization of a channels-last block whose rows hold ``width`` values
    (whole pixels): q = clamp(rint(acc * M), low, high), M per channel repeated along the row."""
    factors = np.tile(multiplier, width // multiplier.size)
    low, high = _F32(low), _F32(high)

    def epilogue(block: np.ndarray) -> None:
        np.multiply(block, factors, out=block)
        np.rint(block, out=block)
        np.clip(block, low, high, out=block)
    return epilogue


def expand_then_depthwise_codes(x: np.ndarray, first: ConvCodes, second: ConvCodes, pads, strides,
                                dilations) -> Codes | None:
    """The chain on the codes ``x`` [N, Ci, H, W] (channels-last float32 integers) of the first conv's
    input: the second conv's result as ``Codes``, or None when the chain does not apply."""
    channels = first.weight.shape[0]
    width = x.shape[3] // strides[1] * channels   # a row of the depthwise output
    out = expand_then_depthwise(
        x, (first.weight, first.bias, requantize_block(first.multiplier, first.low, first.high, channels)),
        (second.weight, second.bias, requantize_block(second.multiplier, second.low, second.high, width)),
        pads, strides, dilations)
    return None if out is None else Codes(out, second.output)


def input_on_grid(operation: Operation, key: tuple | None) -> bool:
    """Whether values on the grid ``key`` lie on the grid of ``operation``'s data input config."""
    data = applied_root(operation.config.input_quantization_config[0])
    return key is not None and data is not None and grid_key(data) == key
