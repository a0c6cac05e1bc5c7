"""Computing ops requantized by an integer multiplier and shift (TPU-MLIR style), run on integer codes.

An op whose output config carries ``requantization`` (Conv, MatMul, Gemm; see
``optim.passes.requantization``) runs as the accelerator computes it: the exact
int32 accumulator of the input and weight codes plus the bias codes,

    acc = sum q_x * q_w + q_b,   q_y = clamp(round(acc * M0 * 2^-rshift) + Z_y, qmin, qmax)

under the config's rounding.  The accumulator is formed by the float kernel on
the codes: in float32 when every partial sum is an integer below 2^24
(``onnxruntime_kernels.product_bounds``; a wider bias added apart), else in
float64 (below 2^53).  The requantization is ``Requantize``, per channel one of:

* float32, clamp(rint(fl32(acc * r))), where ``float32_requantization`` proves it
  equal to the integer formula for every reachable accumulator (most channels);
* float64, t = fl64(acc * (M0 * 2^-rshift)) rounded: the integer formula's result
  in a channel whose shift leaves t's float64 error below the gap between t and a
  rounding boundary (rshift + bits(L) <= 53, L the reach of the codes, see
  ``integer_requantization``), or whose accumulators are small enough for t to be
  exact (max|acc| * M0 < 2^53), or whose reachable t cross no boundary;
* int64 for the other channels.

An op whose channels are all proven runs in float32; one with a few unproven
channels runs the block in float32 and their columns in float64 (``_MIXED_SHARE``);
others in float64.  A conv kernel applies it to each block of its result while
the block is in cache; a fused Relu/Clip whose output config keeps the grid
clamps in the same pass (``fusion.grid_edges``).  What it needs per op is made once
and kept (``ops._prepared``).  The result goes on as the codes
q - Z (``integer_codes.Codes``) or their values S_y * (q - Z).  Equal to the
float simulation (``integer_requantization.requantize_output``, which recovers
acc from the float result) wherever that recovery is exact; where it is not,
this one is the accelerator's arithmetic.  Reads configs; writes nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core import numerics
from ..core.ir import Operation
from ..core.quant import TensorQuantizationConfig
from ..core.quant_graph import requantized
from ..core.rounding import NEAREST_POLICIES, RoundingPolicy, round_into
from .integer_codes import (Codes, bias_codes, code_bound, dequantize_codes, integer_codes, largest_magnitude,
                            per_tensor, zero_point)
from .onnxruntime_kernels import (EXACT_F32, applied_root, clamp_codes, parameter_value, product_bounds,
                                  wants_runtime_kernel)
from .float32_requantization import float32_ratios
from .ops._prepared import prepared
from .ops._threads import parallel_over
from .simulation import grid_key

REQUANTIZING_TYPES = frozenset({"Conv", "MatMul", "Gemm"})
EXACT_F64 = 2.0 ** 53    # integers up to here are exact in float64
_F32 = np.float32
_ROWS_BLOCK = 1 << 16    # elements per block when a whole accumulator is requantized after its kernel
_PIECE = 1 << 18         # elements requantized at a time: with their float64 copy, well inside L2
_MIXED_SHARE = 0.05      # at most this share of unproven channels: float32 for the block, float64 for their
                         # columns (gathered and scattered back: about 0.25 ns an element for each 1% of them)


def wants_requantizing_kernel(operation: Operation) -> bool:
    """Whether ``operation``'s output config requantizes its accumulator by multiplier and shift."""
    config = operation.config
    if config is None or operation.type not in REQUANTIZING_TYPES or not config.output_quantization_config:
        return False
    return requantized(config.output_quantization_config[0], "output")


def wants_integer_kernel(operation: Operation) -> bool:
    """Whether ``operation`` runs as an integer kernel: onnxruntime's, or an integer requantization."""
    return wants_runtime_kernel(operation) or wants_requantizing_kernel(operation)


class Requantize:
    """The requantization of one op's accumulators to codes q - Z, as an epilogue: ``requantize(block,
    out=None)`` works on a block whose last axis holds whole pixels of the op's channels (in place, or into
    ``out`` of the same shape); float32 or float64 integers in, float32 codes out.  Made by
    ``requantization_of``; thread-safe (no state changes after it is made).

    Three ways, per channel: float32 where ``float32_requantization`` proved it exact (``in_float32``: the
    float32 ratios and bias terms), float64 (t = fl64(acc * M0 * 2^-shift), see the module), int64 for the
    ``exact`` channels.  An op with a few unproven channels takes float32 for the block and float64 for
    those channels' columns (``rest``: their indices and their own ``Requantize``)."""

    def __init__(self, rounding: RoundingPolicy, by_rint: bool, multipliers: np.ndarray, shifts: np.ndarray,
                 exact: np.ndarray, low: float, high: float, bias: np.ndarray | None = None,
                 in_float32: tuple | None = None, rest: tuple | None = None):
        self.channels, self.rounding, self.by_rint = multipliers.size, rounding, by_rint
        self.multipliers, self.shifts = multipliers, shifts
        self.ratio = np.ldexp(multipliers.astype(np.float64), -shifts)
        self.exact, self.low, self.high = exact, _F32(low), _F32(high)
        self.bias = bias   # float64 integers per channel added to the accumulators first ("bias apart"), or None
        self.in_float32, self.rest = in_float32, rest
        self._tiled = {}   # (the ratios, the bias) repeated along rows of several pixels, by their count

    def __call__(self, block: np.ndarray, out: np.ndarray | None = None) -> None:
        target = block if out is None else out
        if block.size <= _PIECE or block.ndim == 1:
            self._requantize(block, target)
        elif block.shape[0] == 1:
            self(block[0], target[0])
        else:   # pieces along the leading axis, each in cache with its float64 copy
            step = max(1, block.shape[0] * _PIECE // block.size)
            for start in range(0, block.shape[0], step):
                self(block[start:start + step], target[start:start + step])

    def channels_first(self, block: np.ndarray) -> None:
        """The same, in place, on a block whose channels lie along axis 1 (an NCHW conv result, or a chunk of
        images of it): the factors broadcast along the positions, whose rows stay contiguous."""
        in_float32 = self.in_float32 is not None and block.dtype == _F32
        if (self.exact.size and not in_float32) or block.ndim < 2 or block.shape[1] != self.channels:
            self(np.moveaxis(block, 1, -1))   # the channels last, as a view: the int64 gathers need them there
            return
        ratio, bias = self.in_float32 if in_float32 else (self.ratio, self.bias)
        shape = (self.channels,) + (1,) * (block.ndim - 2)
        ratio, bias = ratio.reshape(shape), None if bias is None else bias.reshape(shape)
        step = max(1, _PIECE // max(block[0].size, 1))
        for start in range(0, block.shape[0], step):
            piece = block[start:start + step]
            if not in_float32:
                self._in_float64(piece, piece, 1, ratio, bias)
                continue
            held = None if self.rest is None else piece[:, self.rest[0]]   # whole rows of those channels
            self._float32_passes(piece, piece, ratio, bias)
            if held is not None:
                self.rest[1].channels_first(held)
                piece[:, self.rest[0]] = held

    def _factors(self, repeat: int) -> tuple:
        factors = self._tiled.get(repeat)
        if factors is None:
            ratio, bias = self.in_float32 if self.in_float32 is not None else (self.ratio, self.bias)
            factors = self._tiled[repeat] = (np.tile(ratio, repeat), None if bias is None else np.tile(bias, repeat))
        return factors

    def _requantize(self, block: np.ndarray, target: np.ndarray) -> None:
        repeat = block.shape[-1] // self.channels   # pixels along the last axis
        ratio, bias = self._factors(repeat)
        if self.in_float32 is not None and block.dtype == _F32:
            self._in_float32(block, target, repeat, ratio, bias)
        else:
            self._in_float64(block, target, repeat, ratio, bias)

    def _in_float32(self, block: np.ndarray, target: np.ndarray, repeat: int, ratio, bias) -> None:
        held = None
        if self.rest is not None:   # the unproven channels' columns, read before the block is overwritten
            index, rest = self.rest
            held = block.reshape(block.shape[:-1] + (repeat, self.channels))[..., index]
        self._float32_passes(block, target, ratio, bias)
        if held is not None:   # [..., repeat, those channels] (a gather: numpy lays it out channel-major)
            rest(held)
            target.reshape(target.shape[:-1] + (repeat, self.channels))[..., index] = held

    def _float32_passes(self, block: np.ndarray, target: np.ndarray, ratio, bias) -> None:
        """clamp(rint(fl32(block * ratio) [+ bias])) into ``target``: three or four float32 passes."""
        np.multiply(block, ratio, out=target)
        if bias is not None:
            np.add(target, bias, out=target)
        np.rint(target, out=target)
        target.clip(self.low, self.high, out=target)

    def _in_float64(self, block: np.ndarray, target: np.ndarray, repeat: int, ratio, bias) -> None:
        held = None
        if self.exact.size:   # read before the block is overwritten
            held = block.reshape(block.shape[:-1] + (repeat, self.channels))[..., self.exact].astype(np.int64)
            if self.bias is not None:
                held += self.bias[self.exact].astype(np.int64)
        t = block.astype(np.float64)   # a cast copy, then in place: cheaper than mixed-type ufuncs
        if bias is not None:
            np.add(t, bias, out=t)   # exact: integers below 2^53
        np.multiply(t, ratio, out=t)
        if self.by_rint:
            np.copyto(target, np.rint(t, out=t), casting="same_kind")
        else:
            round_into(t, target, self.rounding)   # t its scratch; target takes the integers (exact in float32)
        target.clip(self.low, self.high, out=target)   # on float32: cheaper than on float64
        if held is not None:   # channels whose float64 t may round wrongly: the int64 formula
            shaped = target.reshape(target.shape[:-1] + (repeat, self.channels))
            shaped[..., self.exact] = numerics.requantize(
                held, self.multipliers[self.exact], self.shifts[self.exact], 0, int(self.low), int(self.high),
                self.rounding, channel_axis=held.ndim - 1)

    def whole(self, accumulator: np.ndarray, axis: int) -> np.ndarray:
        """The float32 codes of a whole accumulator whose channels lie along ``axis``, a block at a time on
        the kernel threads, in the accumulator's memory order."""
        codes = np.empty_like(accumulator, dtype=_F32)
        source, target = np.moveaxis(accumulator, axis, -1), np.moveaxis(codes, axis, -1)
        rows = source.reshape(-1, self.channels) if source.flags.c_contiguous else None
        if rows is not None:   # channels last in memory: rows of pixels
            step = max(1, _ROWS_BLOCK // self.channels)
            out = target.reshape(-1, self.channels)
            parallel_over(lambda r: self(rows[r:r + step], out[r:r + step]), range(0, rows.shape[0], step))
        else:
            parallel_over(lambda n: self(source[n], target[n]), range(source.shape[0]))
        return codes


def _per_channel(values, channels: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(values, np.int64).reshape(-1), (channels,)).copy()


def requantization_of(output: TensorQuantizationConfig, products: np.ndarray, bias: np.ndarray | None,
                      clamp: tuple | None, bias_apart: bool = False, float32_sums: bool = False) -> Requantize | None:
    """``Requantize`` of ``output``'s requantization for accumulators acc = P + B: |P| bounded per output
    channel by ``products``, B the ``bias`` codes (or none), clamped to ``clamp`` (codes; None: the output's
    range); ``bias_apart``: the accumulators come without B, which ``Requantize`` adds; ``float32_sums``: they
    come as float32 (then where ``float32_requantization`` proves float32 exact for every channel, it runs in
    float32).  None when the channel counts disagree.

    A channel whose float64 t may round wrongly (see the module) is computed on int64 unless every t it can
    take, (B +- max|P|) * M0 * 2^-shift, rounds (nearest) to one code or lies beyond the clamp: a dead
    channel (a tiny weight scale: a long shift, a wide bias) usually does.  Kept for constant bounds and
    bias (``ops._prepared``): made once per op, not every forward."""
    facts = output.requantization
    key = ("requantization", facts, output.rounding, output.quant_min, output.quant_max, zero_point(output),
           None if clamp is None else (float(clamp[0]), float(clamp[1])), bias_apart, float32_sums)
    return prepared(lambda: _requantization_of(output, products, bias, clamp, bias_apart, float32_sums), key,
                    (products, bias))


def _requantization_of(output: TensorQuantizationConfig, products: np.ndarray, bias: np.ndarray | None,
                       clamp: tuple | None, bias_apart: bool, float32_sums: bool) -> Requantize | None:
    facts = output.requantization
    products = np.asarray(products, np.float64).reshape(-1)
    bias = np.zeros(1) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    if not facts.per_channel:
        if bias_apart and bias.size > 1:
            return None
        products, bias = products.max(initial=0.0, keepdims=True), bias[:1] if bias.size == 1 else bias
        if bias.size > 1:   # a per-channel bias under one requantization: the largest bounds all
            bias = np.abs(bias).max(keepdims=True)
    elif len(facts.multiplier) != products.size or bias.size not in (1, products.size):
        return None
    channels = products.size
    bias = np.broadcast_to(bias, (channels,))
    multipliers, shifts = _per_channel(facts.multiplier, channels), _per_channel(facts.right_shift, channels)
    if np.any(np.abs(multipliers) >= 2 ** 53):
        return None
    zero = zero_point(output)
    reach = int(code_bound(output)) + 1
    ratio = np.ldexp(multipliers.astype(np.float64), -shifts)
    low, high = clamp if clamp is not None else (float(output.quant_min - zero), float(output.quant_max - zero))
    totals = products + np.abs(bias)
    exact = (shifts + reach.bit_length() > 53) & (totals * np.abs(multipliers).astype(np.float64) >= EXACT_F64)
    if exact.any() and output.rounding in NEAREST_POLICIES:
        center, spread = bias * ratio, products * np.abs(ratio)
        margin = 2.0 ** -40 * (np.abs(center) + spread + 1.0)
        lowest, highest = center - spread - margin, center + spread + margin
        one_code = np.floor(lowest + 0.5) == np.floor(highest + 0.5)   # no half integer in (lowest, highest]
        exact &= ~(one_code | (highest < low - 0.5) | (lowest > high + 0.5))
    by_rint = output.rounding in NEAREST_POLICIES and not facts.ties_possible(reach)
    apart = bias.copy() if bias_apart else None
    float64 = Requantize(output.rounding, by_rint, multipliers, shifts, np.flatnonzero(exact), low, high, apart)
    if not (float32_sums and output.rounding in NEAREST_POLICIES and float(products.max(initial=0.0)) < EXACT_F32):
        return float64
    ratios, offsets, proven = float32_ratios(multipliers, shifts, products, bias.astype(np.float64), low, high,
                                             output.rounding, bias_apart)
    unproven = np.flatnonzero(~proven)
    if unproven.size > _MIXED_SHARE * channels:
        return float64
    rest = None
    if unproven.size:   # their columns in float64 (int64 where exact): a Requantize of their own
        rest = unproven, Requantize(output.rounding, by_rint, multipliers[unproven], shifts[unproven],
                                    np.flatnonzero(exact[unproven]), low, high,
                                    None if apart is None else apart[unproven])
    return Requantize(output.rounding, by_rint, multipliers, shifts, np.flatnonzero(exact), low, high, apart,
                      (ratios, offsets), rest)


def requantizing_configs(operation: Operation) -> tuple | None:
    """(the op's own output config, its input configs' applied roots) when it can run on codes: a per-tensor
    float32 output scale, a per-tensor data input with zero offset, a weight config; else None."""
    config = operation.config
    output = config.output_quantization_config[0]
    configs = [applied_root(c) for c in config.input_quantization_config]
    if len(configs) < 2 or configs[0] is None or configs[1] is None or not per_tensor(configs[0]) \
            or not per_tensor(output) or np.asarray(output.scale).dtype != _F32 \
            or zero_point(configs[0]) != 0 or np.any(np.asarray(configs[1].offset) != 0):
        return None
    if operation.type == "Gemm" and (operation.attributes.get("alpha", 1.0) != 1.0
                                     or operation.attributes.get("beta", 1.0) != 1.0):
        return None
    return output, configs


def parameter_codes(operation: Operation, arguments: Sequence, configs: list, largest_input: float) -> tuple | None:
    """(weight codes, bias codes or None, per output channel a bound of every partial sum of the products and
    one of |acc|) of a requantizing op whose data codes are at most ``largest_input`` in magnitude; None
    when they are not on their grids, or the bias is float, or no float sums them exactly."""
    weight = integer_codes(configs[1], arguments[1], False)
    if weight is None:
        return None
    bias = None
    if len(arguments) > 2 and arguments[2] is not None:
        if len(configs) < 3 or configs[2] is None:
            return None   # a float bias is not what the accelerator adds
        bias = bias_codes(configs[2], arguments[2], parameter_value(operation, 2))
        if bias is None:
            return None
    products = product_bounds(operation, weight, largest_input)
    totals = products
    if bias is not None:
        if bias.size not in (1, products.size):
            return None
        totals = products + np.abs(bias.reshape(-1))
    if not np.all(totals < EXACT_F64):
        return None
    return weight, bias, products, totals


def summation(float32_codes: bool, products: np.ndarray, totals: np.ndarray) -> str:
    """How an accumulator is summed exactly: "float32" (every partial sum an integer below 2^24), "bias
    apart" (the products' partial sums are: those in float32, the bias added in float64 by ``Requantize``)
    or "float64"; ``float32_codes``: the data and weight codes come as float32."""
    if float32_codes:
        if float(np.max(totals, initial=0.0)) < EXACT_F32:
            return "float32"
        if float(np.max(products, initial=0.0)) < EXACT_F32:
            return "bias apart"
    return "float64"


def as_dtype(codes: np.ndarray, dtype) -> np.ndarray:
    """``codes`` (a parameter's: constant) in ``dtype``, the same array each forward, so that the kernels'
    prepared weights (``ops._prepared``) are kept for it."""
    if codes.dtype == dtype:
        return codes
    return prepared(lambda: codes.astype(dtype), ("codes as", np.dtype(dtype).str), (codes,))


def _requantizes_in_blocks(operation: Operation, inputs: list, requantize: Requantize) -> bool:
    """Whether the kernel may requantize its result block by block: a Conv's blocks say where their channels
    lie; a MatMul's lie along the last axis, whole in every block (not for 1-D operands)."""
    if operation.type == "Conv":
        return True
    a, b = inputs[0], inputs[1]
    return operation.type == "MatMul" and a.ndim >= 2 and b.ndim >= 2 and b.shape[-1] % requantize.channels == 0


def run_requantizing_kernel(operation: Operation, kernel, arguments: Sequence, argument_grids: Sequence = (),
                            clamp_to: np.ndarray | None = None, as_codes: bool = False) -> list | None:
    """The op's outputs as the accelerator computes them (see the module), or None where that does not
    apply.  ``arguments``: the op's inputs after their input configs; ``argument_grids``, ``clamp_to`` (the
    edges of a fused Relu/Clip) and ``as_codes`` as ``onnxruntime_kernels.run_runtime_kernel``'s."""
    gate = requantizing_configs(operation)
    if gate is None:
        return None
    output, configs = gate
    on_grid = len(argument_grids) > 0 and argument_grids[0] is not None \
        and argument_grids[0] == grid_key(configs[0])
    data = integer_codes(configs[0], arguments[0], on_grid)
    if data is None:
        return None
    parts = parameter_codes(operation, arguments, configs, code_bound(configs[0]) if on_grid
                            else largest_magnitude(data))
    if parts is None:
        return None
    weight, bias, products, totals = parts
    how = summation(data.dtype == _F32 and weight.dtype == _F32, products, totals)
    clamp = None if clamp_to is None else clamp_codes(output, clamp_to)
    requantize = requantization_of(output, products, bias, clamp, bias_apart=how == "bias apart",
                                   float32_sums=how != "float64")
    if requantize is None:
        return None
    dtype = np.float64 if how == "float64" else _F32
    inputs = [data.astype(dtype, copy=False), as_dtype(weight, dtype)]
    if bias is not None and how != "bias apart":
        inputs.append(as_dtype(bias, dtype))
    if getattr(kernel, "takes_epilogue", False) and dtype == _F32 and _requantizes_in_blocks(operation, inputs,
                                                                                          requantize):
        codes = kernel(inputs, epilogue=requantize)[0]
    else:
        accumulator = kernel(inputs)[0]
        axis = 1 if operation.type == "Conv" else accumulator.ndim - 1
        if accumulator.shape[axis] % requantize.channels:
            return None
        codes = requantize.whole(accumulator, axis)
    return [Codes(codes, output) if as_codes else dequantize_codes(output, codes)]
