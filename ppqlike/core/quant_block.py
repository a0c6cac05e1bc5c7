"""Block-wise weight quantization (weight-only W4A16 / W8A16): the numerics and the weight's config.

A MatMul/Gemm weight is cut into blocks of ``block_size`` consecutive values along its input dimension K;
each block has its own scale S (and zero point Z when asymmetric), exactly as opset-21 blocked
DequantizeLinear (``block_size`` attribute) and com.microsoft MatMulNBits read them:

    w = S_b * (q - Z_b)        computed in float32: float(q - Z) * S, what onnxruntime's kernels compute

The scale array has the weight's shape with the block axis cut to ceil(K / block_size) (ONNX's layout for
blocked DequantizeLinear); a last, shorter block is allowed.  Symmetric blocks use the signed range
[-2^(b-1), 2^(b-1) - 1] with Z = 0 and S = (the block's value of largest magnitude) / -2^(b-1): that value
is exact at the wide end of the range, the whole range is used, and S is negative where that value is
positive (DequantizeLinear and MatMulNBits read scales of either sign); values of the other sign reach
2^(b-1) - 1 at most, clamped there by less than one step.  (On MiniLM-L6 at block 32 this keeps the
embedding cosine at 0.9717 where absmax / (2^(b-1) - 0.5), every value within half a step, gave 0.9647.)
Asymmetric blocks use [0, 2^b - 1] with the block's [min, max] widened to contain 0 (DESIGN.md section 2).

:class:`BlockQuantizationConfig` is a TensorQuantizationConfig whose scale and offset are such block arrays
(``channel_axis`` is the block axis K); it is created BAKED with its integer codes and ``baked_value``
(the dequantized weight the simulation uses), and DEQUANTIZED gives the FP32 weight back like any config.
"""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import QuantizationStateError
from ppqlike.core.quant import QuantizationStates, TensorQuantizationConfig
from ppqlike.core.quant_grid import readonly
from ppqlike.core.quant_policy import QuantizationPolicy, QuantizationProperty as P

__all__ = ["BlockQuantizationConfig", "block_count", "expand_blocks", "block_parameters", "quantize_blocks",
           "dequantize_blocks", "block_range", "is_block_config"]


def block_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """The integer range of a block: signed [-2^(b-1), 2^(b-1)-1] when symmetric, else [0, 2^b-1]."""
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if symmetric else (0, (1 << bits) - 1)


def block_count(length: int, block_size: int) -> int:
    """Blocks along an axis of ``length`` values (the last may be shorter)."""
    return -(-length // block_size)


def expand_blocks(per_block: np.ndarray, axis: int, block_size: int, length: int) -> np.ndarray:
    """Each block's value repeated over the ``block_size`` positions it covers, cut to ``length``."""
    expanded = np.repeat(per_block, block_size, axis=axis)
    return np.take(expanded, np.arange(length), axis=axis) if expanded.shape[axis] != length else expanded


def _blocked(weight: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """``weight`` as [..., blocks, block_size, ...] along ``axis`` (zero-padded: zeros change no range that
    is widened to contain 0)."""
    length = weight.shape[axis]
    blocks = block_count(length, block_size)
    padding = [(0, 0)] * weight.ndim
    padding[axis] = (0, blocks * block_size - length)
    padded = np.pad(weight, padding)
    shape = list(weight.shape)
    shape[axis:axis + 1] = [blocks, block_size]
    return padded.reshape(shape)


def block_parameters(weight: np.ndarray, axis: int, block_size: int, bits: int, symmetric: bool,
                     ratio: float | np.ndarray = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(scale float32, zero point int64) per block of ``weight`` from its range; ``ratio`` (scalar, or one
    per block) shrinks the range first (a clipping search tries ratios below 1)."""
    blocked = _blocked(np.asarray(weight, np.float64), axis, block_size)
    low, high = block_range(bits, symmetric)
    if symmetric:   # the block's value of largest magnitude lands on the range's end -2^(b-1) exactly
        largest = np.argmax(np.abs(blocked), axis=axis + 1)
        extreme = np.take_along_axis(blocked, np.expand_dims(largest, axis + 1), axis=axis + 1).squeeze(axis + 1)
        scale = extreme * ratio / low
        zero = np.zeros(scale.shape, np.int64)
    else:
        lowest = np.minimum(blocked.min(axis=axis + 1), 0.0) * ratio
        highest = np.maximum(blocked.max(axis=axis + 1), 0.0) * ratio
        scale = (highest - lowest) / (high - low)
        scale = np.where(scale > 0, scale, 1.0)
        zero = np.clip(np.rint(low - lowest / scale), low, high).astype(np.int64)
    scale = np.where(scale != 0, scale, 1.0).astype(np.float32)   # an all-zero block: any scale is exact
    scale = np.where(scale != 0, scale, np.finfo(np.float32).tiny)   # (underflow in float32)
    return scale, zero


def quantize_blocks(weight: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int, block_size: int,
                    bits: int, symmetric: bool) -> np.ndarray:
    """Integer codes clamp(round_half_even(w / S) + Z) per block (int64), as QuantizeLinear computes them."""
    length = weight.shape[axis]
    low, high = block_range(bits, symmetric)
    s = expand_blocks(np.asarray(scale, np.float32), axis, block_size, length)
    z = expand_blocks(np.asarray(zero, np.int64), axis, block_size, length)
    q = np.rint(np.asarray(weight, np.float32) / s).astype(np.int64) + z
    return np.clip(q, low, high)


def dequantize_blocks(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int,
                      block_size: int) -> np.ndarray:
    """float32 (q - Z) * S per block, bit for bit what onnxruntime's blocked DequantizeLinear and its
    MatMulNBits dequantization compute."""
    length = codes.shape[axis]
    s = expand_blocks(np.asarray(scale, np.float32), axis, block_size, length)
    z = expand_blocks(np.asarray(zero, np.int64), axis, block_size, length)
    return ((codes - z).astype(np.float32) * s).astype(np.float32)


def is_block_config(config) -> bool:
    """Whether ``config`` quantizes its tensor block-wise."""
    return isinstance(config, BlockQuantizationConfig)


class BlockQuantizationConfig(TensorQuantizationConfig):
    """The BAKED config of a block-quantized weight: block scales/zero points (arrays shaped like the weight
    with the block axis cut to its block count), the integer ``codes`` and, as ``baked_value``, the float32
    weight they dequantize to.  ``method`` says how the codes were chosen ('rtn', 'gptq', 'awq')."""

    def __init__(self, name: str, bits: int, symmetric: bool, block_axis: int, block_size: int,
                 scale: np.ndarray, zero: np.ndarray, codes: np.ndarray, method: str = "rtn"):
        low, high = block_range(bits, symmetric)
        policy = QuantizationPolicy(P.PER_CHANNEL | P.LINEAR | (P.SYMMETRICAL if symmetric else P.ASYMMETRICAL))
        self.block_size = int(block_size)
        super().__init__(policy, "ROUND_HALF_EVEN", bits, low, high, observer_algorithm=method,
                         channel_axis=block_axis, name=name)
        codes = np.asarray(codes, np.int64)
        if np.any((codes < low) | (codes > high)):
            raise QuantizationStateError(f"{self._who()}: codes outside [{low}, {high}]")
        expected = list(codes.shape)
        expected[block_axis] = block_count(codes.shape[block_axis], block_size)
        self._store(scale, zero)
        if list(self._scale.shape) != expected:
            raise QuantizationStateError(f"{self._who()}: {list(self._scale.shape)} block scales for a weight of "
                                         f"shape {list(codes.shape)} in blocks of {block_size} (want {expected})")
        self.method = method
        self.codes = readonly(codes.copy())
        self.baked_value = dequantize_blocks(codes, self._scale, self._offset, block_axis, self.block_size)
        self.state = QuantizationStates.BAKED

    def _store(self, scale, offset) -> None:
        """Block arrays: scales finite and > 0 (float32), zero points integers in the range, same shape."""
        if scale is None or offset is None:
            raise QuantizationStateError(f"{self._who()}: block scales and zero points are set together")
        s = np.asarray(scale, np.float32)
        z = np.asarray(offset)
        if not np.all(np.isfinite(s) & (s != 0)) or (not self._policy.symmetric and np.any(s < 0)):
            raise QuantizationStateError(f"{self._who()}: block scales must be finite and nonzero in float32 "
                                         "(and positive for asymmetric blocks)")
        if z.shape != s.shape or not np.issubdtype(z.dtype, np.integer):
            raise QuantizationStateError(f"{self._who()}: block zero points must be integers shaped like the "
                                         f"scales {list(s.shape)}, got {z.dtype} {list(z.shape)}")
        if np.any((z < self._qmin) | (z > self._qmax)):
            raise QuantizationStateError(f"{self._who()}: block zero points outside [{self._qmin}, {self._qmax}]")
        if self._policy.symmetric and np.any(z != 0):
            raise QuantizationStateError(f"{self._who()}: symmetric blocks have zero points 0")
        self._scale, self._offset = readonly(s.copy()), readonly(z.astype(np.int64))

    def _params(self):
        raise QuantizationStateError(f"{self._who()}: block quantization has no per-tensor/per-channel "
                                     "quantizer; use quantize, dequantize or fake_quantize")

    def _call(self, fn, values, **options):
        raise QuantizationStateError(f"{self._who()}: block quantization has no per-tensor/per-channel "
                                     "quantizer; use quantize, dequantize or fake_quantize")

    def fake_quantize(self, x, out: np.ndarray | None = None, map_blocks=None) -> np.ndarray:
        """dequantize(quantize(x)) with these block scales, float32 (into ``out`` when given)."""
        result = self.dequantize(self.quantize(x))
        if out is None:
            return result
        out[...] = result
        return out

    def quantize_codes(self, x, map_blocks=None) -> np.ndarray:
        """q - Z as float32 (S times them is ``fake_quantize(x)``, block by block)."""
        length = np.shape(x)[self._channel_axis]
        zero = expand_blocks(self._offset, self._channel_axis, self.block_size, length)
        return (self.quantize(x) - zero).astype(np.float32)

    def quantize(self, x) -> np.ndarray:
        """Integer codes of ``x`` with these block scales (int64)."""
        return quantize_blocks(x, self._scale, self._offset, self._channel_axis, self.block_size, self._bits,
                               self._policy.symmetric)

    def dequantize(self, q) -> np.ndarray:
        return dequantize_blocks(np.asarray(q, np.int64), self._scale, self._offset, self._channel_axis,
                                 self.block_size)

    def to_dict(self) -> dict:
        """JSON-ready: the block arrays as nested lists (the codes are not written: the exported model holds
        them)."""
        dequantized_from = self.dequantized_from
        return {"name": self.name, "state": self.state.name,
                "dequantized_from": None if dequantized_from is None else dequantized_from.name,
                "policy": self.policy.to_dict()["properties"], "rounding": self.rounding.name,
                "num_of_bits": self.num_of_bits, "quant_min": self.quant_min, "quant_max": self.quant_max,
                "channel_axis": self._channel_axis, "observer_algorithm": self.method,
                "scale": self._scale.tolist(), "offset": self._offset.tolist(), "masters": [],
                "detail": dict(self.detail), "requantization": None, "runtime_kernel": None,
                "block_size": self.block_size, "method": self.method}

    def __repr__(self) -> str:
        return (f"BlockTQC({self.name!r} {self.state.name} {self.num_of_bits}b[{self.quant_min},{self.quant_max}] "
                f"blocks of {self.block_size} on axis {self._channel_axis}, {self.method})")
