"""Quantized ops computed as onnxruntime's CPU integer kernels compute them (bit for bit).

onnxruntime fuses a QDQ model's DequantizeLinear -> op -> QuantizeLinear
groups into integer kernels (QLinearConv, QLinearMatMul, QGemm, QLinearAdd,
QLinearMul, QLinearGlobalAveragePool).  Their results differ from "float op on
dequantized values, then QuantizeLinear" wherever a value lies near a
rounding boundary, and over fifty layers such one-step flips compound.  An
op whose output config carries ``runtime_kernel = 'onnxruntime'`` (marked
by ``RuntimeKernelPass``) is therefore simulated as the kernel computes it.
With q the integers, z the zero points and S the scales (float32, as the
exported model stores them):

* Conv / MatMul / Gemm (QLinearConv, QLinearMatMul, QGemm):
  acc = sum (q_x - z_x)(q_w - z_w) + q_bias, exact (computed on integers in
  float32 when max|x| * max_c sum|w| + max|bias| < 2^24 bounds every partial
  sum; a convolution whose products alone fit adds its bias apart: bias =
  h + l with h = float32(bias) and l small, acc + l exact in float32, then
  one correctly rounded float32 addition of h; else all in float64);
  M = float32(float32(S_x * S_w) / S_y) per output channel;
  q_y = clamp(rint(float32(acc) * M), qmin - z_y, qmax - z_y) + z_y
  (MLAS's requantization: a float32 product rounded half to even).
* Add (QLinearAdd): with r_a = float32(S_a / S_y), r_b = float32(S_b / S_y)
  and f = z_y - (r_a z_a + r_b z_b), q_y = clamp(rint(fma(r_a, q_a,
  fma(r_b, q_b, f)))) in float32 (see ``onnxruntime_elementwise.qlinear_add``).
* Mul (QLinearMul): the int32 product p = (q_a - z_a)(q_b - z_b), r = float32(float32(S_a S_b) / S_y),
  q_y = clamp(rint(float32(p) * r + z_y)) in float32, two roundings (see ``onnxruntime_elementwise.qlinear_mul``).
* GlobalAveragePool (QLinearGlobalAveragePool): acc = sum (q_x - z_x) over
  the N spatial positions; M = float32(S_x / float32(S_y * N)); then as Conv.

The output is quantized with the op's own output config, or, when that is
OVERLAPPED by a fused activation's (Conv -> Relu/Clip), on the grid of the
config at the end of the chain, which is where onnxruntime quantizes once
the activation is folded into the quantization range; the clamp is then
left to the activation and that config, so the op's own output still holds
its pre-activation values (what hooks and the error analysis read).  An op whose inputs are
not all quantized (the graph running dequantized, or during calibration)
runs its ordinary float kernel, and so does an op whose input values are
not on their configs' grids (their producer ran in float).  Without hooks,
an integer kernel's result goes to the next one as its codes q - z
(``integer_codes.Codes``: no multiplication by S_y, no recovery of the
codes from the values); the executor turns them into values for any other
reader.  Reads the configs; writes nothing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..core.ir import Operation
from ..core.layout import channel_view, memory_axes
from ..core.numerics import along_channel_axis
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked
from ..core.quant_graph import awaits_master, overlapped_root
from ..core.requantization import RUNTIME_KERNEL_ONNXRUNTIME
from .integer_codes import (Codes, bias_codes, channel_chunks, code_bound, integer_codes, largest_magnitude,
                            per_tensor, zero_point)
from .onnxruntime_elementwise import qlinear_add_kernel, qlinear_mul_kernel
from .ops._prepared import prepared
from .ops._threads import parallel_over
from .simulation import grid_key

RUNTIME_KERNEL = RUNTIME_KERNEL_ONNXRUNTIME
LINEAR_TYPES = frozenset({"Conv", "MatMul", "Gemm"})
SUPPORTED_TYPES = LINEAR_TYPES | {"Add", "Mul", "GlobalAveragePool"}
_F32 = np.float32
_REQUANTIZE_BLOCK = 1 << 17   # elements per block of a requantization: its 3-4 passes stay in L2 (measured
                              # on a 16 x 112 x 112 x 96 result: 17.2 ms at 2^15, 12.7 ms at 2^17)


def wants_runtime_kernel(operation: Operation) -> bool:
    """Whether ``operation`` is marked to run as onnxruntime's integer kernel."""
    config = operation.config
    if config is None or operation.type not in SUPPORTED_TYPES or not config.output_quantization_config:
        return False
    output = config.output_quantization_config[0]
    return output is not None and output.runtime_kernel == RUNTIME_KERNEL


def applied_root(config: TensorQuantizationConfig | None) -> TensorQuantizationConfig | None:
    """The applied config that quantizes the value seen through ``config`` (following OVERLAPPED), or None."""
    if config is None:
        return None
    config = overlapped_root(config)
    if not (is_applied(config.state) or is_baked(config.state)) or awaits_master(config):
        return None
    return config


EXACT_F32 = 2.0 ** 24    # integers up to here are exact in float32
INT32 = 2.0 ** 31


def product_bounds(operation: Operation, weight: np.ndarray, largest_input: float) -> np.ndarray:
    """Per output channel, a bound on every partial sum of its products: ``largest_input`` * sum |w| over
    the channel's weights (one inf for a Gemm with transA, not bounded here).  Kept for constant weight codes
    (``ops._prepared``)."""
    key = ("product bounds", operation.type, operation.attributes.get("transA", 0),
           operation.attributes.get("transB", 0), float(largest_input))
    return prepared(lambda: _product_bounds(operation, weight, largest_input), key, (weight,))


def _product_bounds(operation: Operation, weight: np.ndarray, largest_input: float) -> np.ndarray:
    if operation.type == "Gemm" and operation.attributes.get("transA", 0):
        return np.array([np.inf])
    if operation.type == "Conv":
        per_output = np.abs(weight).reshape(weight.shape[0], -1).sum(axis=1, dtype=np.float64)
    else:  # MatMul / Gemm: the contraction runs along the weight's first axis unless transB
        axis = 1 if operation.type == "Gemm" and operation.attributes.get("transB", 0) else -2
        per_output = np.abs(weight).sum(axis=axis, dtype=np.float64) if weight.ndim > 1 else np.abs(weight).sum()
    return largest_input * np.asarray(per_output, np.float64).reshape(-1)


def _precision(operation: Operation, integers: list, products: float, total: float) -> str:
    """How the accumulator is computed exactly, given the bounds of the products' partial sums and of
    the whole (bias included): "float32" (every partial sum below 2^24), "bias apart" (a convolution
    whose products alone stay below 2^24: those in float32, the wide bias added apart) or
    "float64"."""
    if integers[0].dtype != _F32 or integers[1].dtype != _F32:
        return "float64"
    if total < EXACT_F32:
        return "float32"
    if operation.type == "Conv" and len(integers) > 2 and products + 2.0 ** 8 < EXACT_F32:   # + |l| (<= 2^6)
        return "bias apart"
    return "float64"


def wrap_int32(accumulator: np.ndarray) -> np.ndarray:
    """The int32 the kernel holds for an exact (float64) accumulator: two's complement wrap-around,
    which onnxruntime's int32 addition of a saturated bias code produces.  In place; values already in
    int32's range (the usual case: two reductions tell) are left as they are, values within 2^32 of it
    move by 2^32 once, others take a modulo."""
    if accumulator.size == 0:
        return accumulator
    low, high = float(accumulator.min()), float(accumulator.max())
    if -INT32 <= low and high < INT32:
        return accumulator
    if -3 * INT32 <= low and high < 3 * INT32:
        np.subtract(accumulator, 2 * INT32, out=accumulator, where=accumulator >= INT32)
        np.add(accumulator, 2 * INT32, out=accumulator, where=accumulator < -INT32)
        return accumulator
    np.add(accumulator, INT32, out=accumulator)
    np.mod(accumulator, 2 * INT32, out=accumulator)
    np.subtract(accumulator, INT32, out=accumulator)
    return accumulator


def _requantize(accumulator: np.ndarray, multiplier, output: TensorQuantizationConfig,
                clamp: bool | tuple = True, axis: int | None = None, bias: np.ndarray | None = None,
                as_codes: bool = False):
    """MLAS's requantization of an exact accumulator, then dequantized with ``output``.

    q = clamp(rint(float32(acc) * M)) with M per channel along ``axis`` (a 1-D array) or one
    value; ``clamp=False`` (the op's activation is fused after it) leaves the range to the
    activation op and the quantization after it, so the op's own output keeps its pre-activation
    values; a (low, high) pair of codes q - z clamps to those instead of the output's range.
    ``as_codes``: the result may be ``Codes`` (skipping the last multiplication by S_y).  ``bias``
    (float32 per channel along ``axis``): added to the float32 ``accumulator`` first (one rounding).
    Works in place on a float32 ``accumulator``, a cache-sized block at a time.
    """
    zero = zero_point(output)
    low, high = clamp if isinstance(clamp, tuple) else (output.quant_min - zero, output.quant_max - zero)
    fresh = accumulator.dtype == _F32 and accumulator.flags.writeable and memory_axes(accumulator) is not None
    multiplier = np.asarray(multiplier, _F32).reshape(-1)
    scale = np.asarray(output.scale)
    if bias is not None and (not fresh or scale.dtype != _F32 or scale.size != 1 or axis is None):
        accumulator = accumulator + along_channel_axis(bias, accumulator.ndim, accumulator.shape, axis)
        fresh, bias = False, None
    q = accumulator if fresh else np.ascontiguousarray(accumulator, dtype=_F32)
    if scale.dtype != _F32 or scale.size != 1 or (multiplier.size > 1 and axis is None):
        q *= multiplier if multiplier.size == 1 else along_channel_axis(multiplier, q.ndim, q.shape, axis)
        np.rint(q, out=q)
        if clamp is not False:
            np.clip(q, low, high, out=q)
        return output.dequantize((q + zero).astype(np.int64))
    low, high = _F32(low), _F32(high)
    scale = scale.reshape(())
    if bias is not None and multiplier.size == 1:   # blocks along the channels, for the bias
        multiplier = np.full(q.shape[axis], multiplier[0], _F32)
    blocks = channel_view(q, axis if multiplier.size > 1 else None)   # q in memory order, channels middle
    factors = multiplier.reshape(1, -1, 1)
    def requantize_chunk(chunk):   # elementwise: the chunks on the kernel threads
        rows, channels = chunk
        block, factor = blocks[rows, channels], factors[:, channels]
        if bias is not None:
            np.add(block, bias[channels].reshape(factor.shape), out=block)
        np.multiply(block, factor, out=block)
        np.rint(block, out=block)
        if clamp is not False:
            block.clip(low, high, out=block)
        if not as_codes:
            np.multiply(block, scale, out=block)   # S * (q - z): output.dequantize's float32 arithmetic
    parallel_over(requantize_chunk, list(channel_chunks(blocks.shape, _REQUANTIZE_BLOCK)))
    return Codes(q, output) if as_codes else q


def channel_multiplier(scale_in, scale_weight, scale_out) -> np.ndarray:
    """float32(float32(S_in * S_w) / S_out), one value per output channel (or one)."""
    product = (_F32(scale_in) * np.asarray(scale_weight, _F32)).astype(_F32)
    return (product / _F32(scale_out)).astype(_F32).reshape(-1)


def _output_axis(operation: Operation, rank: int) -> int:
    if operation.type == "Conv":
        return 1
    return rank - 1  # MatMul / Gemm: the output's last axis (Gemm's transB is the kernel's business)


def activation_fused(operation: Operation) -> bool:
    own = operation.config.output_quantization_config[0]
    return own.state is QuantizationStates.OVERLAPPED


def _linear(operation, kernel, arguments, configs, output, on_grid, clamp, as_codes):
    data, weight = configs[0], configs[1]
    if data is None or weight is None or not per_tensor(data):
        return None
    if operation.type == "Gemm" and (operation.attributes.get("alpha", 1.0) != 1.0
                                     or operation.attributes.get("beta", 1.0) != 1.0):
        return None
    bias_config = configs[2] if len(configs) > 2 else None
    if len(arguments) > 2 and arguments[2] is not None and bias_config is None:
        return None  # a float bias (kept FP32) is not what QLinearConv computes
    integers = [integer_codes(data, arguments[0], on_grid[0]), integer_codes(weight, arguments[1], on_grid[1])]
    if len(arguments) > 2 and arguments[2] is not None:  # int32 codes: found in float64
        integers.append(bias_codes(bias_config, arguments[2], parameter_value(operation, 2)))
    if any(i is None for i in integers):
        return None
    largest_input = code_bound(data) if on_grid[0] else largest_magnitude(integers[0])
    bounds = product_bounds(operation, integers[1], largest_input)   # per output channel
    products = float(np.max(bounds, initial=0.0))
    total = products + (largest_magnitude(integers[2]) if len(integers) > 2 else 0.0)
    precision = _precision(operation, integers, products, total)
    bias = None
    if precision == "bias apart":   # the products exact in float32, the wide (saturated int32) bias not
        rest, bias, wide = split_bias(integers[2], bounds)
        accumulator = kernel(integers[:2] + [rest])[0]
        if wide.size:   # channels whose int32 sum may wrap: formed exactly in float64, wrapped, stored
            exact = accumulator[:, wide].astype(np.float64)
            exact += bias[wide].astype(np.float64).reshape((1, -1) + (1,) * (exact.ndim - 2))
            accumulator[:, wide] = wrap_int32(exact)   # float32(the kernel's int32), its bias in it
            bias[wide] = 0.0
    else:
        dtype = _F32 if precision == "float32" else np.float64
        integers = [i.astype(dtype, copy=False) for i in integers]
        integers += list(arguments[len(integers):])
        accumulator = kernel(integers)[0]
        if total >= INT32:
            accumulator = wrap_int32(accumulator.astype(np.float64))
    axis = _output_axis(operation, accumulator.ndim)
    if np.size(weight.scale) not in (1, accumulator.shape[axis]):
        return None
    multiplier = channel_multiplier(data.scale, weight.scale, output.scale)
    return [_requantize(accumulator, multiplier, output, clamp=clamp or not activation_fused(operation), axis=axis,
                        bias=bias, as_codes=as_codes)]


def split_bias(bias: np.ndarray, products) -> tuple:
    """A "bias apart" bias (integer codes per output channel): (l, h, wide) with h = float32(bias) and
    l = bias - h (|l| <= 2^7), both float32, and the channels whose int32 sum with the products may wrap
    around (|bias| + products >= 2^31; ``products``: the bound of each channel's partial sums, or one for
    all, see ``product_bounds``)."""
    bias = np.asarray(bias, np.float64).reshape(-1)
    high = bias.astype(_F32)
    return (bias - high).astype(_F32), high, np.flatnonzero(np.abs(bias) + products >= INT32)


def parameter_value(operation: Operation, index: int):
    """The float value of the op's parameter input ``index`` as stored (before its config), or None."""
    variable = operation.inputs[index] if index < len(operation.inputs) else None
    return variable.value if variable is not None and variable.is_parameter else None


def _global_average_pool(operation, kernel, arguments, configs, output, on_grid, clamp, as_codes):
    data = configs[0]
    if data is None or not per_tensor(data):
        return None
    integers = integer_codes(data, arguments[0], on_grid[0])
    if integers is None:
        return None
    positions = int(np.prod(integers.shape[2:]))
    accumulator = integers.sum(axis=tuple(range(2, integers.ndim)), keepdims=True, dtype=np.float64)
    multiplier = _F32(_F32(data.scale) / _F32(_F32(output.scale) * _F32(positions)))
    return [_requantize(accumulator, multiplier, output, clamp=clamp or True, as_codes=as_codes)]


_KERNELS: dict[str, Callable] = {"Conv": _linear, "MatMul": _linear, "Gemm": _linear, "Add": qlinear_add_kernel,
                                 "Mul": qlinear_mul_kernel, "GlobalAveragePool": _global_average_pool}


def run_runtime_kernel(operation: Operation, kernel: Callable, arguments: Sequence,
                       argument_grids: Sequence = (), clamp_to: np.ndarray | None = None,
                       as_codes: bool = False) -> list | None:
    """The op's outputs as onnxruntime's integer kernel computes them, or None where it does not apply.

    ``arguments`` are the op's inputs after its input configs (already
    quantized values); ``argument_grids[i]``, where given, is the grid key
    (``simulation.grid_key``) of the config that last quantized argument i.
    The result is dequantized float32, already on the output grid of the
    quantizing config.  ``clamp_to``: [low, high] on that grid, the edges of
    a Relu/Clip fused after the op (``fusion.grid_edges``), to which the
    result is clamped in place of the config's range.  ``as_codes``: a result may
    come as ``integer_codes.Codes`` (the next integer kernel reads them as they are).
    """
    gate = integer_configs(operation)
    if gate is None:
        return None
    output, configs = gate
    on_grid = [index < len(argument_grids) and config is not None and argument_grids[index] is not None
               and argument_grids[index] == grid_key(config) for index, config in enumerate(configs)]
    on_grid += [False] * (len(arguments) - len(on_grid))
    clamp = None if clamp_to is None else clamp_codes(output, clamp_to)
    return _KERNELS[operation.type](operation, kernel, list(arguments), configs, output, on_grid, clamp, as_codes)


def integer_configs(operation: Operation) -> tuple | None:
    """(output config, input configs) an integer kernel of ``operation`` computes with (the applied roots;
    each kernel checks the inputs it needs), or None when onnxruntime's kernels do not apply: an output
    not quantized per tensor, or baked, or an 8-bit kernel's first two inputs or output wider (16-bit QDQ
    groups run in float)."""
    config = operation.config
    output = applied_root(config.output_quantization_config[0])
    if output is None or not per_tensor(output) or output.state is QuantizationStates.BAKED:
        return None
    configs = [applied_root(c) for c in config.input_quantization_config]
    if output.num_of_bits > 8 or any(c is not None and c.num_of_bits > 8 for c in configs[:2]):
        return None
    return output, configs


def clamp_codes(output: TensorQuantizationConfig, edges: np.ndarray | None) -> tuple:
    """(low, high) codes q - z a result on ``output``'s (per-tensor) grid is clamped to: the codes of a
    fused activation's ``edges`` S * (q - z) (exact: the nearest integers of edges / S), or the range's."""
    if edges is None:
        zero = zero_point(output)
        return float(output.quant_min - zero), float(output.quant_max - zero)
    codes = np.rint(np.asarray(edges, _F32) / np.asarray(output.scale, _F32).reshape(()))
    return float(codes[0]), float(codes[1])
