"""Integer codes of values that lie on a quantization grid, for simulating integer kernels.

A value quantized with a config is S * (q - z) in float32; the integer kernels
onnxruntime runs work on the codes q - z.  These helpers recover them (checking
the value lies on the grid, unless the executor knows it does), bound them, and
turn codes back into values exactly as ``TensorQuantizationConfig.dequantize``
does.  Per-tensor work runs a cache-sized block at a time.  Reads configs;
writes nothing.  ``channel_chunks`` cuts elementwise work on per-channel factors
(an array seen through ``core.layout.channel_view``) into cache-sized blocks (both
requantizations use it).
"""

from __future__ import annotations

import numpy as np

from ..core.layout import dense, empty_like_dense, flat_view
from ..core.numerics import along_channel_axis
from ..core.quant import TensorQuantizationConfig
from .ops._prepared import prepared

F32 = np.float32
BLOCK = 1 << 15   # elements per block of the per-tensor paths


class Codes:
    """An integer kernel's result held as its codes q - z (integer-valued float32, any memory order),
    standing for the values S * (q - z) of ``config`` (per tensor, float32 scale): the next integer
    kernel reads the codes as they are instead of recovering them from the values.  ``values()`` turns
    them into those values in place, once (the codes are gone after)."""

    __slots__ = ("config", "_array", "_are_codes")

    def __init__(self, codes: np.ndarray, config: TensorQuantizationConfig):
        self.config, self._array, self._are_codes = config, codes, True

    @property
    def shape(self) -> tuple:
        return self._array.shape

    @property
    def size(self) -> int:
        return self._array.size

    def codes(self) -> np.ndarray | None:
        """The codes, or None once they were turned into values."""
        return self._array if self._are_codes else None

    def values(self) -> np.ndarray:
        """S * (q - z), as ``dequantize_codes`` computes it (in place the first time)."""
        if self._are_codes:
            self._array, self._are_codes = dequantize_codes(self.config, self._array), False
        return self._array


def values_hold_codes(names: tuple, values: dict) -> bool:
    """Whether the executor's ``values`` hold ``Codes`` for the first of ``names``."""
    return bool(names) and isinstance(values.get(names[0]), Codes)


def values_of(value):
    """``value`` itself, or the values of ``Codes``."""
    return value.values() if isinstance(value, Codes) else value


def per_tensor(config: TensorQuantizationConfig) -> bool:
    """Whether ``config`` has one scale for the whole tensor."""
    return np.size(config.scale) == 1


def grid_facts(config: TensorQuantizationConfig) -> tuple:
    """What a config's quantization and codes depend on, by content (a key of ``ops._prepared``)."""
    scale, offset = np.asarray(config.scale), np.asarray(config.offset)
    return (scale.dtype.str, scale.shape, scale.tobytes(), offset.tobytes(), config.quant_min, config.quant_max,
            config.channel_axis, config.rounding, config.num_of_bits)


def integer_codes(config: TensorQuantizationConfig, value, on_grid: bool = False) -> np.ndarray | None:
    """q - z of a value already on ``config``'s grid, as integer-valued floats; None if it is not on the grid.

    A value is on the grid when the op producing it quantized it; it is not when that op ran in
    float (the error analyses run one op quantized at a time), and then the float kernel runs.
    float32 values give float32 integers (exact: 8-bit codes), others float64.  value / S is within
    a few float32 ulps of q - z, so the nearest integer is exact.  Per-tensor scales run block by
    block (in cache), stopping at the first block off the grid.  ``on_grid``: the executor knows the
    value lies on this grid (it quantized it so), and the check is skipped; then ``Codes`` give their
    codes as they are (read only).
    """
    if isinstance(value, Codes):
        if on_grid and value.codes() is not None:
            return value.codes()
        value = value.values()
    if not isinstance(value, np.ndarray):
        return _integer_codes(config, value, on_grid)
    return prepared(lambda: _integer_codes(config, value, on_grid),
                    lambda: ("integer codes", on_grid) + grid_facts(config), (value,))


def _integer_codes(config: TensorQuantizationConfig, value, on_grid: bool) -> np.ndarray | None:
    value = np.asarray(value)
    dtype = F32 if value.dtype == F32 else np.float64
    scale = along_channel_axis(np.asarray(config.scale, dtype), value.ndim, value.shape, config.channel_axis)
    if scale.ndim == 0 and value.size > BLOCK:
        return _integers_blockwise(dense(value), scale, dtype, check=not on_grid)
    if on_grid and value.ndim:
        integers = np.divide(value, scale, dtype=dtype)
        return np.rint(integers, out=integers)
    steps = np.divide(value, scale, dtype=dtype)
    if steps.ndim == 0:  # a numpy scalar: give it an array to work in
        steps = np.array(steps)
    integers = np.rint(steps, out=np.empty_like(steps))
    if integers.size and not _on_grid(steps, integers):
        return None
    return integers


def bias_codes(config: TensorQuantizationConfig, value, original) -> np.ndarray | None:
    """q - z (float64 integers) of a bias the op reads as ``value`` (its config's baked value), as the
    exporter writes them: quantize(``original``) when those dequantize to ``value`` (int32 codes past
    2^24 do not survive a float32 value: a saturated code 2^31 - 1 would come back as 2^31), else
    ``integer_codes`` of ``value``."""
    value = np.asarray(value)
    return prepared(lambda: _bias_codes(config, value, original), lambda: ("bias codes",) + grid_facts(config),
                    (value, original))


def _bias_codes(config: TensorQuantizationConfig, value: np.ndarray, original) -> np.ndarray | None:
    if original is not None and np.shape(original) == value.shape:
        codes = config.quantize(np.asarray(original))
        if np.array_equal(config.dequantize(codes), value):
            return (codes - np.asarray(config.offset, np.int64)).astype(np.float64)
    return integer_codes(config, value.astype(np.float64))


def _on_grid(steps: np.ndarray, integers: np.ndarray) -> bool:
    """Whether value / S (``steps``, overwritten) is within float32 error of its nearest integers."""
    np.subtract(steps, integers, out=steps)
    worst = max(float(steps.max()), -float(steps.min()))
    return worst <= 1e-3 + 1e-6 * largest_magnitude(integers)   # NaN: False


def _integers_blockwise(value: np.ndarray, scale: np.ndarray, dtype, check: bool) -> np.ndarray | None:
    integers = empty_like_dense(value, dtype)   # in the value's memory order (channels-last stays so)
    source, target = flat_view(value), flat_view(integers)
    scratch = np.empty(BLOCK, dtype) if check else None
    for start in range(0, source.size, BLOCK):
        block = target[start:start + BLOCK]
        steps = scratch[:block.size] if check else block
        np.divide(source[start:start + BLOCK], scale, out=steps)
        np.rint(steps, out=block)
        if check and not _on_grid(steps, block):
            return None
    return integers


def largest_magnitude(integers: np.ndarray) -> float:
    """max |integers| (0 for an empty array; NaN propagates)."""
    return max(float(integers.max()), -float(integers.min())) if integers.size else 0.0


def code_bound(config: TensorQuantizationConfig) -> float:
    """The largest |q - z| a value quantized (and clamped) with ``config`` can hold."""
    zero = zero_point(config)
    return float(max(config.quant_max - zero, zero - config.quant_min))


def dequantize_codes(output: TensorQuantizationConfig, codes: np.ndarray) -> np.ndarray:
    """S * (q - z) for ``codes`` = q - z held as integer-valued float32 (exact), in place when it can;
    the float32 values ``output.dequantize(q)`` gives."""
    scale = np.asarray(output.scale)
    if scale.dtype != F32 or scale.size != 1 or codes.dtype != F32:
        return output.dequantize((codes + zero_point(output)).astype(np.int64))
    np.multiply(codes, scale.reshape(()), out=codes)
    return codes


def zero_point(config: TensorQuantizationConfig) -> int:
    """The zero point of a per-tensor config."""
    return int(np.asarray(config.offset).reshape(-1)[0])


def channel_chunks(view: tuple, block: int = BLOCK):
    """(rows, channels) slices covering an [outer, channels, inner] array in blocks of about ``block``
    elements: whole rows when a row is small, else channel ranges of one row."""
    outer, channels, inner = view
    if channels * inner <= block:
        step = max(1, block // max(channels * inner, 1))
        for start in range(0, outer, step):
            yield slice(start, start + step), slice(0, channels)
        return
    step = max(1, block // max(inner, 1))
    for row in range(outer):
        for start in range(0, channels, step):
            yield slice(row, row + 1), slice(start, start + step)
