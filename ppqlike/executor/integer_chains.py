"""An expansion chain of integer kernels run as one kernel, on codes.

A quantized MobileNet block's 1x1 expansion (its Relu/Clip folded into the
quantization range) and the depthwise conv reading it - onnxruntime's
QLinearConvs, or convs requantized by an integer multiplier and shift (TPU
style, ``requantizing_kernels``) - run as
``ops._conv_channels_last.expand_then_depthwise`` runs the float pair, a group
of images at a time: the GEMM on the input's codes, the requantization of each
block while it is in cache (``requantize_block``), the depthwise convolution on
those codes, its requantization, so that the expanded activation - neither its
accumulator nor its codes - never goes to memory whole.  The result is the
second conv's codes (``integer_codes.Codes``).

Equal bit for bit to the two integer kernels run one after the other
(``onnxruntime_kernels``, ``requantizing_kernels``): every partial sum of the
products is an integer below 2^24, exact in float32 in any order (a conv whose
sums may not be is not chained), a bias too wide for that is added after them
as the unchained kernel adds it ("bias apart"), and the requantization is the
same elementwise arithmetic.  Reads configs; writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ir import Operation
from ..core.quant import TensorQuantizationConfig
from ..core.quant_graph import input_config, overlapped_root
from .integer_codes import Codes, bias_codes, code_bound, grid_facts, integer_codes, largest_magnitude, per_tensor
from .onnxruntime_kernels import (EXACT_F32, activation_fused, applied_root, channel_multiplier, clamp_codes,
                                  integer_configs, parameter_value, product_bounds, split_bias, wrap_int32)
from .ops._conv_expand_chain import expand_then_depthwise
from .ops._prepared import prepared
from .requantizing_kernels import (Requantize, as_dtype, parameter_codes, requantization_of, requantizing_configs,
                                   summation, wants_requantizing_kernel)
from .simulation import grid_key, requantized_grid

_F32 = np.float32


@dataclass(frozen=True)
class ConvCodes:
    """What one integer Conv of a chain computes with: its weight and bias codes (float32 integers;
    a bias too wide for float32 sums as ``bias`` + ``bias_high``, added after the products as
    onnxruntime_kernels' "bias apart"), the requantization multiplier per output channel, the codes
    its result is clamped to, and the config its result's codes belong to."""
    weight: np.ndarray
    bias: np.ndarray | None
    bias_high: np.ndarray | None
    wide: np.ndarray   # channels whose int32 sum may wrap around (then formed in float64 and wrapped)
    multiplier: np.ndarray | None
    low: float
    high: float
    output: TensorQuantizationConfig
    requantize: Requantize | None = None   # an integer requantization (multiplier and shift) instead of M


def conv_codes(operation: Operation, arguments: list, edges: np.ndarray | None) -> ConvCodes | None:
    """``ConvCodes`` of a Conv run as an integer kernel (``requantizing_kernels.wants_integer_kernel``), from
    its weight and bias after their input configs (``arguments[1:]``); ``edges``: a fused Relu/Clip's
    (``fusion.grid_edges``).  None when the chain cannot compute it exactly in float32 (then the ops run one
    by one)."""
    if wants_requantizing_kernel(operation):
        return _requantizing_codes(operation, arguments, edges)
    gate = integer_configs(operation)
    if gate is None:
        return None
    output, configs = gate
    if np.asarray(output.scale).dtype != _F32 or len(configs) < 2 or configs[0] is None or configs[1] is None \
            or not per_tensor(configs[0]):
        return None
    if edges is None and activation_fused(operation):
        return None   # its activation is not folded into the clamp
    weight = integer_codes(configs[1], arguments[1])
    if weight is None or weight.dtype != _F32 or np.size(configs[1].scale) not in (1, weight.shape[0]):
        return None
    bounds = product_bounds(operation, weight, code_bound(configs[0]))   # per output channel
    bias, high, wide = None, None, np.zeros(0, np.int64)
    if len(arguments) > 2 and arguments[2] is not None:
        if len(configs) < 3 or configs[2] is None:
            return None
        value, original = arguments[2], parameter_value(operation, 2)
        parts = prepared(lambda: _bias_parts(configs[2], value, original, bounds),
                         lambda: ("chain bias",) + grid_facts(configs[2]), (value, original, bounds))
        if parts is None:
            return None
        bias, high, wide = parts
    multiplier = channel_multiplier(configs[0].scale, configs[1].scale, output.scale)
    multiplier = np.broadcast_to(multiplier, (weight.shape[0],)).astype(_F32)
    low, high_code = clamp_codes(output, edges)
    return ConvCodes(weight, bias, high, wide, multiplier, low, high_code, output)


def _requantizing_codes(operation: Operation, arguments: list, edges: np.ndarray | None) -> ConvCodes | None:
    """``ConvCodes`` of a Conv requantized by multiplier and shift (``requantizing_kernels``), its products'
    sums exact in float32 (a wide bias added by its ``Requantize``); None otherwise."""
    gate = requantizing_configs(operation)
    if gate is None:
        return None
    output, configs = gate
    if requantized_grid(output) != grid_key(overlapped_root(output)):
        return None   # the chain's result is recorded on the grid of the config at the end of the chain
    parts = parameter_codes(operation, arguments, configs, code_bound(configs[0]))
    if parts is None:
        return None
    weight, bias, products, totals = parts
    how = summation(weight.dtype == _F32, products, totals)   # the input codes are float32 integers
    if how == "float64":
        return None
    clamp = None if edges is None else clamp_codes(output, edges)
    requantize = requantization_of(output, products, bias, clamp, bias_apart=how == "bias apart",
                                   float32_sums=True)
    if requantize is None or requantize.channels != weight.shape[0]:
        return None
    channels = weight.shape[0]
    if bias is None or how == "bias apart":   # (apart: its Requantize adds it)
        bias = None
    elif bias.shape == (channels,):
        bias = as_dtype(bias, _F32)   # the same array each forward: the kernels keep their GEMM weights for it
    else:
        bias = np.broadcast_to(bias.reshape(-1), (channels,)).astype(_F32)
    return ConvCodes(weight, bias, None, np.zeros(0, np.int64), None, requantize.low, requantize.high, output,
                     requantize)


def _bias_parts(config: TensorQuantizationConfig, value, original, bounds: np.ndarray) -> tuple | None:
    """(float32 bias codes the products are summed with, the part added after them or None, the channels
    whose int32 sum may wrap) of a chained conv's bias, or None when it cannot be summed exactly."""
    bias = bias_codes(config, value, original)
    if bias is None:
        return None
    bias = bias.reshape(-1)
    products = float(np.max(bounds, initial=0.0))
    if products + largest_magnitude(bias) < EXACT_F32:
        return bias.astype(_F32), None, np.zeros(0, np.int64)
    if products + 2.0 ** 8 >= EXACT_F32:   # "bias apart": l in the GEMM/einsum, h after
        return None
    return split_bias(bias, bounds)


def requantize_block(codes: ConvCodes):
    """The in-cache requantization of a channels-last block whose last axis holds whole pixels (any number
    of them): q = clamp(rint((acc + h) * M), low, high), h (the wide bias's float32 part) and M per channel
    repeated along the row (laid out once per row width); ``epilogue(block, out=None)`` in place or into
    ``out``.  A conv requantized by multiplier and shift: its ``Requantize``, which takes such blocks too."""
    if codes.requantize is not None:
        return codes.requantize
    channels = codes.multiplier.size
    low, high = _F32(codes.low), _F32(codes.high)
    rows = {}   # per row width: (factors, high bias, the wide channels' columns, their float64 bias)

    def row_factors(width: int) -> tuple:
        made = rows.get(width)
        if made is None:   # (two threads may both make it: the same arrays)
            repeat = width // channels
            factors = np.tile(codes.multiplier, repeat)
            high_bias = None if codes.bias_high is None else np.tile(codes.bias_high, repeat)
            columns = (np.arange(repeat)[:, None] * channels + codes.wide[None, :]).reshape(-1)
            wide_bias = None
            if columns.size:
                wide_bias = high_bias[columns].astype(np.float64)
                high_bias[columns] = 0.0
            made = rows[width] = (factors, high_bias, columns, wide_bias)
        return made

    def epilogue(block: np.ndarray, out: np.ndarray | None = None) -> None:
        factors, high_bias, columns, wide_bias = row_factors(block.shape[-1])
        target = block if out is None else out   # block may be overwritten either way
        if columns.size:   # float32(the int32 the kernel holds), as onnxruntime_kernels forms it
            block[..., columns] = wrap_int32(block[..., columns].astype(np.float64) + wide_bias)
        if high_bias is not None:
            np.add(block, high_bias, out=target)
            block = target
        np.multiply(block, factors, out=target)
        np.rint(target, out=target)
        target.clip(low, high, out=target)
    return epilogue


def expand_then_depthwise_codes(x: np.ndarray, first: ConvCodes, second: ConvCodes, pads, strides,
                                dilations, third: ConvCodes | None = None) -> Codes | None:
    """The chain on the codes ``x`` [N, Ci, H, W] (channels-last float32 integers) of the first conv's
    input: the second conv's result as ``Codes`` - or, with ``third`` (the 1x1 projection reading it), the
    third's -, or None when the chain does not apply."""
    project = None if third is None else (third.weight, third.bias, requantize_block(third))
    out = expand_then_depthwise(x, (first.weight, first.bias, requantize_block(first)),
                                (second.weight, second.bias, requantize_block(second)), pads, strides, dilations,
                                project)
    return None if out is None else Codes(out, (second if third is None else third).output)


def input_on_grid(operation: Operation, key: tuple | None) -> bool:
    """Whether values on the grid ``key`` lie on the grid of ``operation``'s data input config."""
    data = applied_root(input_config(operation, 0))
    return key is not None and data is not None and grid_key(data) == key
