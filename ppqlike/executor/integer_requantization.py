"""The integer requantization of a computing op's output (``config.requantization``, TPU style).

The float output y is turned back into its int32 accumulator acc = round(y / S_acc) (exact up to float
error), requantized with the stored integer multiplier M0 and right shift under the config's rounding,
and dequantized with the output scale: S * (clamp(round(acc * M0 * 2^-shift)) - z).

t = acc * (M0 * 2^-shift) in float64 rounds under the policy to the integer of the int64 multiply and
rounding right shift when
* shift + bits(L) <= 53, L = max(|qmin - z|, |qmax - z|) + 1: where |t| < L its rounding error is below
  half an ulp of L, under the 2^-shift that parts a multiple of 2^-shift from any other half integer,
  so no decision moves; where |t| >= L the clamp decides either way (rounding is monotone);
* or max|acc| * M0 < 2^53: then t is exact.
Each channel is decided alone (a dead channel's tiny weight scale gives it a long shift and a large
accumulator): the float64 path runs on the whole block, then the channels it may get wrong - where t lies
within its float64 error of a half integer (a nearest policy), or of anything (another) - are computed
again on the int64 path.  Where no t with |t| < L is a tie (``IntegerRequantization.ties_possible``: any
multiplier whose odd part is 2L or more) a nearest policy is rint alone.  The values S * (q - z): the
float64 product of the integer (below 2^24) and the float32 S is exact, so its float32 rounding is
dequantize's float32 product.

Elementwise, a cache-sized block at a time on the kernel threads, each with float64 buffers of its own;
a channels-last result's blocks are seen as rows of several pixels, with the per-channel factors tiled
along them, so that numpy's loops run long.  Reads the config; writes only the result.
"""

from __future__ import annotations

import numpy as np

from ..core import numerics
from ..core.layout import channel_view, dense, empty_like_dense
from ..core.quant import TensorQuantizationConfig
from ..core.rounding import NEAREST_POLICIES, round_into
from .integer_codes import channel_chunks, code_bound
from .ops._threads import parallel_items

_BLOCK = 1 << 17   # elements per chunk: its passes each a numpy call, so chunks large enough that two threads
                   # seldom wait for the GIL
_ROW = 2048        # a channels-last chunk is seen as rows of about this many elements (whole pixels)


def requantize_output(config: TensorQuantizationConfig, value) -> np.ndarray:
    """The float32 values the op's output takes through its integer requantization (see the module)."""
    facts = config.requantization
    per_channel = facts.per_channel
    axis = facts.channel_axis % value.ndim if per_channel else None
    value = dense(value)
    result = empty_like_dense(value, np.float32)
    source, out = channel_view(value, axis), channel_view(result, axis)   # [outer, channels, inner]
    outer, channels, inner = source.shape
    pixels = max(1, _ROW // channels) if per_channel and inner == 1 else 1   # per row of the tiled view
    if pixels > 1:   # whole rows of pixels, a multiple of ``pixels`` in each chunk but the last
        step = max(pixels, _BLOCK // channels // pixels * pixels)
        chunks = [(slice(start, min(outer, start + step)), slice(0, channels)) for start in range(0, outer, step)]
    else:
        chunks = list(channel_chunks(source.shape, _BLOCK))
    requantizer = _Requantizer(config, pixels)
    largest = max((source[rows, kept].size for rows, kept in chunks), default=0)

    def requantize_chunk(index, buffers):   # elementwise: the chunks on the kernel threads
        rows, kept = chunks[index]
        requantizer.run(source[rows, kept], kept, buffers, out[rows, kept])
    parallel_items(requantize_chunk, len(chunks), lambda: (np.empty(largest), np.empty(largest)))
    return result


class _Requantizer:
    """One op's requantization constants, made once a run (``pixels``: how many pixels of a channels-last
    result one row of the tiled view holds; 1: blocks broadcast the factors along their middle axis)."""

    def __init__(self, config: TensorQuantizationConfig, pixels: int):
        facts = config.requantization
        self.config, self.pixels, self.per_channel = config, pixels, facts.per_channel
        self.offset = int(config.offset)
        self.reach = int(code_bound(config)) + 1
        self.multipliers = np.asarray(facts.multiplier, np.int64).reshape(-1)
        self.shifts = np.asarray(facts.right_shift, np.int64).reshape(-1)
        self.accumulator_scale = np.asarray(facts.accumulator_scale, np.float64).reshape(-1)
        self.ratio = np.ldexp(self.multipliers.astype(np.float64), -self.shifts)
        self.long_shifts = self.shifts + self.reach.bit_length() > 53   # channels whose t may round wrongly
        scale = np.asarray(config.scale)
        self.in_float64 = scale.dtype == np.float32 and scale.size == 1
        self.by_rint = config.rounding in NEAREST_POLICIES and not facts.ties_possible(self.reach)
        if self.in_float64:
            self.step = np.float64(scale.reshape(()))
            self.edges = (np.float32((config.quant_min - self.offset) * self.step),
                          np.float32((config.quant_max - self.offset) * self.step))
        if pixels > 1:
            self.tiled_scale, self.tiled_ratio = np.tile(self.accumulator_scale, pixels), np.tile(self.ratio, pixels)

    def _factors(self, block: np.ndarray, kept: slice, target: np.ndarray) -> tuple:
        """(the shape the elementwise work sees the block in, accumulator scales, ratios) broadcast to it."""
        block_shape = block.shape
        rows, channels, inner = block_shape
        if not self.per_channel:
            return block_shape, self.accumulator_scale[0], self.ratio[0]
        if self.pixels > 1 and rows % self.pixels == 0 and block.flags.c_contiguous and target.flags.c_contiguous:
            return (rows // self.pixels, self.pixels * channels), self.tiled_scale, self.tiled_ratio
        return block_shape, self.accumulator_scale[kept].reshape(1, -1, 1), self.ratio[kept].reshape(1, -1, 1)

    def run(self, block: np.ndarray, kept: slice, buffers: tuple, target: np.ndarray) -> None:
        """Requantize ``block`` [rows, channels ``kept``, inner] into ``target`` (float32, the same shape)."""
        shape, scales, ratios = self._factors(block, kept, target)
        acc, scratch = (b[:block.size].reshape(shape) for b in buffers)
        np.divide(block.reshape(shape), scales, out=acc, dtype=np.float64)
        np.rint(acc, out=acc)
        accumulators = acc.reshape(block.shape)
        multipliers, shifts = self.multipliers[kept], self.shifts[kept]
        wide = np.flatnonzero(self.long_shifts[kept])
        if wide.size:   # of those, the ones whose max|acc| * M0 reaches 2^53 (acc kept before it is overwritten)
            held = accumulators[:, wide]
            largest = np.abs(held).max(axis=(0, 2), initial=0.0)
            wrong = largest * np.abs(multipliers[wide]).astype(np.float64) >= 2.0 ** 53
            wide, held = wide[wrong], held[:, wrong]
            if wide.size and self.per_channel and self.in_float64 and self.config.rounding in NEAREST_POLICIES:
                wide, held = self._near_ties(held, wide, kept)
        if not self.in_float64 or (wide.size and not self.per_channel):   # all on the int64 path
            q = numerics.requantize(accumulators.astype(np.int64), multipliers, shifts, self.offset,
                                    self.config.quant_min, self.config.quant_max, self.config.rounding, channel_axis=1)
            target[...] = numerics.dequantize(q, self.config.scale, self.config.offset)
            return
        self._in_float64(acc, scratch, ratios, target.reshape(shape))
        for index, channel in enumerate(wide):   # one at a time: the int64 bound is each channel's own
            q = numerics.requantize(held[:, index].astype(np.int64), int(multipliers[channel]), int(shifts[channel]),
                                    self.offset, self.config.quant_min, self.config.quant_max, self.config.rounding)
            target[:, channel] = numerics.dequantize(q, self.config.scale, self.config.offset)

    def _near_ties(self, held: np.ndarray, wide: np.ndarray, kept: slice) -> tuple:
        """Of the channels ``wide`` (their accumulators ``held``) whose float64 t may be rounded wrongly, those
        where it may indeed: t = fl(acc * M0 * 2^-shift) is within 2^-53 |t| of the exact value, so the
        float64 path's nearest integer is the exact one wherever t lies further than that from every half
        integer (or beyond the range, where the clamp decides)."""
        t = held * self.ratio[kept][wide].reshape(1, -1, 1)
        distance = np.abs(np.abs(t - np.rint(t)) - 0.5)   # to the nearest half integer
        near = (distance <= 2.0 ** -50 * np.maximum(np.abs(t), 1.0)) & (np.abs(t) < self.reach + 1)
        doubtful = near.any(axis=(0, 2)) | (np.abs(self.multipliers[kept][wide]) >= 2 ** 53)   # (M0 * 2^-shift inexact)
        return wide[doubtful], held[:, doubtful]

    def _in_float64(self, acc: np.ndarray, scratch: np.ndarray, ratios, target: np.ndarray) -> None:
        """The float64 path on the whole block (``acc`` overwritten)."""
        t = np.multiply(acc, ratios, out=acc)
        if self.by_rint:
            rounded = np.rint(t, out=scratch)   # no t in range is a tie: every nearest policy is rint
        else:
            rounded = round_into(t, scratch, self.config.rounding)   # t: its scratch
        with np.errstate(over="ignore"):   # codes far out of range: inf, which the clamp below takes to its edge
            np.multiply(rounded, self.step, out=target, casting="same_kind")
        # the clamp of q into range on the values, in float32 (S * code is monotone in the code, and the edges
        # are the products S * (qmin - z), S * (qmax - z) rounded as the values are)
        target.clip(self.edges[0], self.edges[1], out=target)
