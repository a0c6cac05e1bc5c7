"""onnxruntime's elementwise integer kernels, QLinearAdd and QLinearMul, bit for bit (see
``onnxruntime_kernels``, which dispatches to them).

Both take two per-tensor quantized operands' codes.  Large operands read a
table of the op's results on every pair of 8-bit codes (``_pair_lookup``)
instead of the float64 fused-multiply-add emulation on every element.  Reads
configs; writes nothing.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.layout import empty_like_dense, flat_view, memory_axes, same_layout
from .integer_codes import BLOCK, Codes, dequantize_codes, integer_codes, per_tensor, zero_point
from .ops._threads import parallel_items

_F32 = np.float32
_TABLE_MIN = 1 << 16          # elements of a binary op's operands from which it reads a table of code pairs
_TABLE_SIZE = 1 << 16         # the most code pairs such a table holds
_TABLES_KEPT = 64             # tables kept between runs (one per quantized Add/Mul of a model, keyed by its grids)
_TABLES: dict = {}            # key -> read-only table (see ``_pair_lookup``), oldest first


def _fma(a, b, c) -> np.ndarray:
    """float32(a * b + c) rounded once, as an FMA instruction computes it (float64 holds a float32 product exactly)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(_F32)


def qlinear_add(qa, qb, scale_a, zero_a, scale_b, zero_b, scale_y, zero_y, quant_min, quant_max) -> np.ndarray:
    """onnxruntime's QLinearAdd on integers (MLAS, x86 with FMA), bit for bit.

    r_a = S_a / S_y, r_b = S_b / S_y and the fixed part f = z_y - (r_a z_a + r_b z_b) in float32,
    then y = fma(r_a, q_a, fma(r_b, q_b, f)), rounded half to even and clamped.  The order of the
    fused multiply-adds decides exact ties (measured against onnxruntime on tie-heavy inputs).
    """
    ratio_a = _F32(_F32(scale_a) / _F32(scale_y))
    ratio_b = _F32(_F32(scale_b) / _F32(scale_y))
    fixed = _F32(_F32(zero_y) - _fma(ratio_a, _F32(zero_a), _F32(ratio_b * _F32(zero_b))))
    value = _fma(ratio_a, np.asarray(qa, _F32), _fma(ratio_b, np.asarray(qb, _F32), fixed))
    return np.clip(np.rint(value), quant_min, quant_max)


def qlinear_mul(qa, qb, scale_a, zero_a, scale_b, zero_b, scale_y, zero_y, quant_min, quant_max) -> np.ndarray:
    """onnxruntime's QLinearMul on integers (MLAS, its x86 SSE2 kernel), bit for bit.

    The product (q_a - z_a)(q_b - z_b) is exact in int32 and in float32 (|p| <= 2^16); it is multiplied by
    r = float32(float32(S_a * S_b) / S_y), then z_y is added (two float32 roundings, no FMA), rounded half to
    even and clamped.
    """
    ratio = _F32(_F32(_F32(scale_a) * _F32(scale_b)) / _F32(scale_y))
    product = ((np.asarray(qa, np.int64) - int(zero_a)) * (np.asarray(qb, np.int64) - int(zero_b))).astype(_F32)
    value = (product * ratio).astype(_F32) + _F32(zero_y)
    return np.clip(np.rint(value), quant_min, quant_max)


def _binary(arithmetic: Callable, scalars: bool):
    """The kernel of a binary elementwise op on two per-tensor quantized operands (``scalars``: whether a
    one-element operand takes the same arithmetic inside onnxruntime)."""
    def run(operation, kernel, arguments, configs, output, on_grid, clamp, as_codes):
        if len(configs) < 2 or configs[0] is None or configs[1] is None:
            return None
        if not (per_tensor(configs[0]) and per_tensor(configs[1])):
            return None
        if not scalars and any(np.size(value) == 1 for value in arguments[:2]):
            return None
        integers = [integer_codes(config, value, known)
                    for config, value, known in zip(configs[:2], arguments[:2], on_grid)]
        if any(i is None for i in integers):
            return None
        (a, b), zeros = integers, [zero_point(config) for config in configs[:2]]
        low, high = (output.quant_min, output.quant_max) if clamp is None else \
            (clamp[0] + zero_point(output), clamp[1] + zero_point(output))

        def compute(a, b):   # onnxruntime's codes, then S_y (q - z_y) as output.dequantize computes it
            q = arithmetic(a + zeros[0], b + zeros[1], configs[0].scale, zeros[0], configs[1].scale, zeros[1],
                           output.scale, zero_point(output), low, high)
            q -= zero_point(output)
            return q if codes else dequantize_codes(output, q)
        codes = as_codes and np.asarray(output.scale).dtype == _F32 and per_tensor(output)
        finish = (lambda q: Codes(q, output)) if codes else (lambda values: values)
        if a.size + b.size >= _TABLE_MIN:
            grids = tuple((np.asarray(v).dtype.str, np.asarray(v).tobytes())
                          for c in (configs[0], configs[1], output) for v in (c.scale, c.offset))
            key = (arithmetic, grids, int(low), int(high), codes)   # the zero points are in the grids
            looked_up = _pair_lookup(compute, [c.quant_min - z for c, z in zip(configs, zeros)],
                                     [c.quant_max - z for c, z in zip(configs, zeros)], a, b, key)
            if looked_up is not None:
                return [finish(looked_up)]
        if not same_layout(a, b) or a.size <= BLOCK or memory_axes(a) is None:
            return [finish(compute(a, b))]
        out = empty_like_dense(a, _F32)   # elementwise: block by block, the float64 temporaries in cache
        flat_a, flat_b, flat_out = flat_view(a), flat_view(b), flat_view(out)
        for start in range(0, flat_a.size, BLOCK):
            flat_out[start:start + BLOCK] = compute(flat_a[start:start + BLOCK], flat_b[start:start + BLOCK])
        return [finish(out)]
    return run


def _pair_lookup(compute: Callable, lows: list, highs: list, a: np.ndarray, b: np.ndarray,
                 key: tuple | None = None) -> np.ndarray | None:
    """``compute(a, b)`` (elementwise, on codes a in [lows[0], highs[0]] and b in [lows[1], highs[1]]) read
    from a table of its results on every pair of codes: 8-bit codes have at most 2^16 pairs, and a few
    float32 passes to index the table replace the float64 arithmetic on every element.  ``key``: what
    ``compute`` depends on (the grids, the clamp), under which the table is kept for the next run.  None
    when the codes are wider or some code lies outside its range."""
    width = highs[1] - lows[1] + 1
    if (highs[0] - lows[0] + 1) * width > _TABLE_SIZE:
        return None
    key = None if key is None else (key, tuple(lows), tuple(highs))
    table = _TABLES.get(key) if key is not None else None
    if table is None:
        table = compute(np.arange(lows[0], highs[0] + 1, dtype=_F32)[:, None],
                        np.arange(lows[1], highs[1] + 1, dtype=_F32)[None, :]).reshape(-1)
        if key is not None:
            table.flags.writeable = False
            if len(_TABLES) >= _TABLES_KEPT:
                del _TABLES[next(iter(_TABLES))]
            _TABLES[key] = table
    shape = np.broadcast_shapes(a.shape, b.shape)
    if not shape:
        return None
    big = a if a.shape == shape else b if b.shape == shape else None
    out = empty_like_dense(big, _F32) if big is not None and memory_axes(big) is not None else np.empty(shape, _F32)
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    if same_layout(a, b) and same_layout(a, out):   # one memory order: contiguous blocks of the flat views
        a, b, out_view, step = flat_view(a), flat_view(b), flat_view(out), _TABLE_MIN
    else:                                           # blocks along the first axis
        out_view, step = out, max(1, _TABLE_MIN // max(1, int(np.prod(shape[1:]))))
    offset = _F32(lows[0] * width + lows[1])
    outside = []

    def look_up(block, _):
        rows = slice(block * step, (block + 1) * step)
        index = np.multiply(a[rows], _F32(width))   # (a - low_a) * width + (b - low_b), exact in float32
        index += b[rows]
        index -= offset
        if index.size and not (float(index.min()) >= 0 and float(index.max()) < table.size):
            outside.append(block)
        else:
            np.take(table, index.astype(np.int32), out=out_view[rows], mode="clip")   # in range: checked above
    parallel_items(look_up, -(-len(a) // step))
    return None if outside else out


qlinear_add_kernel = _binary(qlinear_add, scalars=False)  # a scalar operand takes another path inside QLinearAdd
qlinear_mul_kernel = _binary(qlinear_mul, scalars=True)   # QLinearMul's scalar path computes the same
