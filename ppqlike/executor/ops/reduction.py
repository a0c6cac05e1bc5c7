"""Kernels of the reduction op family: Reduce*, ArgMax/ArgMin and TopK.

Reduce* ops take their axes from the ``axes`` attribute before opset 18
(ReduceSum: before 13) and from an optional second input since.  Omitted or
empty axes reduce everything, unless ``noop_with_empty_axes`` is set: then
nothing is reduced and the elementwise part of the op (square, abs, ...) still
applies, as in onnxruntime.  Results keep the input dtype; integer means
truncate toward zero.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, by_opset, normalize_axis, unsupported

_QUIET = dict(all="ignore")


def _accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype sums run in: float16 sums accumulate in float32."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _sum(x, axes, keepdims):
    """A sum as an ndarray (numpy returns scalars for full reductions)."""
    out = np.sum(x, axis=axes, keepdims=keepdims, dtype=_accumulator(x.dtype))
    return np.asarray(out).astype(x.dtype, copy=False)


def _mean(x, axes, keepdims):
    if x.dtype.kind == "f":
        out = np.mean(x, axis=axes, keepdims=keepdims, dtype=_accumulator(x.dtype))
        return out.astype(x.dtype, copy=False)
    total = np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
    count = max(x.size, 1) // max(total.size, 1)
    quotient, remainder = np.divmod(total, count)
    if x.dtype.kind == "i":  # round toward zero like C integer division
        quotient += ((remainder != 0) & (total < 0)).astype(x.dtype)
    return quotient


def _extreme(function, kind: str):
    """ReduceMax / ReduceMin; an empty reduction yields the identity (-inf / +inf) like onnxruntime."""
    def reduce(x, axes, keepdims):
        if x.size == 0:
            if x.dtype.kind == "f":
                initial = -np.inf if kind == "max" else np.inf
            elif x.dtype.kind == "b":
                initial = kind != "max"
            else:
                info = np.iinfo(x.dtype)
                initial = info.min if kind == "max" else info.max
            return function(x, axis=axes, keepdims=keepdims, initial=initial)
        return function(x, axis=axes, keepdims=keepdims)
    return reduce


def _prod(x, axes, keepdims):
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=_accumulator(x.dtype)).astype(x.dtype, copy=False)


def _l1(x, axes, keepdims):
    return _sum(np.abs(x), axes, keepdims)


def _sum_square(x, axes, keepdims):
    return _sum(np.square(x), axes, keepdims)


def _float_of(function):
    """Run ``function`` in floats and cast back: integer L2/LogSum results are truncated."""
    def reduce(x, axes, keepdims):
        with np.errstate(**_QUIET):
            if x.dtype.kind == "f":
                return function(x, axes, keepdims)
            return function(x.astype(np.float64), axes, keepdims).astype(x.dtype)
    return reduce


def _l2(x, axes, keepdims):
    out = _sum_square(x, axes, keepdims)
    return np.sqrt(out, out=out)


def _log_sum(x, axes, keepdims):
    out = _sum(x, axes, keepdims)
    return np.log(out, out=out)


def _log_sum_exp(x, axes, keepdims):
    """max + log(sum(exp(x - max))), with max replaced by 0 where it is infinite."""
    peak = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    peak[~np.isfinite(peak)] = 0
    out = _sum(np.exp(x - peak), axes, True)
    np.log(out, out=out)
    out += peak
    if not keepdims:
        out = out.reshape(()) if axes is None else np.squeeze(out, axis=axes)
    return out


_REDUCERS = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": _extreme(np.max, "max"),
    "ReduceMin": _extreme(np.min, "min"),
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _float_of(_l2),
    "ReduceSumSquare": _sum_square,
    "ReduceLogSum": _float_of(_log_sum),
    "ReduceLogSumExp": _float_of(_log_sum_exp),
}


def _build_reduce_1(op, opset: int) -> Kernel:
    """Reduce* with the ``axes`` attribute (all of them before opset 18, ReduceSum before 13)."""
    return _reduce_kernel(op, axes_input=False)


def _build_reduce_18(op, opset: int) -> Kernel:
    """Reduce* with ``axes`` as an optional input (opset 18; ReduceSum since 13)."""
    return _reduce_kernel(op, axes_input=True)


def _reduce_kernel(op, axes_input: bool) -> Kernel:
    reduce = _REDUCERS[op.type]
    keepdims = bool(attribute(op, "keepdims", 1))
    noop = bool(attribute(op, "noop_with_empty_axes", 0))
    attribute_axes = None if axes_input else attribute(op, "axes", None)

    def kernel(inputs):
        x = inputs[0]
        axes = attribute_axes
        if axes_input and len(inputs) > 1 and inputs[1] is not None:
            axes = inputs[1]
        axes = () if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))
        if not axes:
            axes = () if noop else None  # None reduces every axis
        else:
            for axis in axes:
                if not -x.ndim <= axis < x.ndim:
                    raise unsupported(op, f"axis {axis} is out of range for rank {x.ndim}")
            axes = tuple(normalize_axis(a, x.ndim) for a in axes)
        out = reduce(x, axes, keepdims)
        return [out if type(out) is np.ndarray else np.asarray(out)]
    return kernel


def _build_arg(op, opset: int) -> Kernel:
    """ArgMax / ArgMin: int64 index of the first (or, with select_last_index, last) extreme."""
    function = np.argmax if op.type == "ArgMax" else np.argmin
    axis = int(attribute(op, "axis", 0))
    keepdims = bool(attribute(op, "keepdims", 1))
    last = bool(attribute(op, "select_last_index", 0))

    def kernel(inputs):
        x = inputs[0]
        if not -x.ndim <= axis < x.ndim:
            raise unsupported(op, f"axis {axis} is out of range for rank {x.ndim}")
        a = normalize_axis(axis, x.ndim)
        if last:
            index = function(np.flip(x, a), axis=a, keepdims=keepdims)
            index = (x.shape[a] - 1) - index
        else:
            index = function(x, axis=a, keepdims=keepdims)
        return [np.asarray(index, dtype=np.int64)]
    return kernel


def _order_keys(x: np.ndarray, axis: int, largest: bool):
    """uint64 keys, unique along ``axis``, whose ascending order (descending when
    ``largest``) is TopK's order: by value, then by ascending index.  None for
    dtypes wider than 32 bits."""
    if x.dtype.itemsize > 4 or x.dtype.kind not in "fiub":
        return None
    if x.dtype.kind == "f":  # float bits -> unsigned ints of the same order; -0 becomes +0
        bits = np.add(x, 0, dtype=np.float32).view(np.uint32)
        flip = np.negative(bits >> 31)
        flip |= np.uint32(0x80000000)
        values = np.bitwise_xor(bits, flip, out=flip)
    elif x.dtype.kind == "i":
        values = x.astype(np.int64) - np.iinfo(np.int32).min
    else:
        values = x
    keys = values.astype(np.uint64) << np.uint64(32)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    index = np.arange(x.shape[axis], dtype=np.uint64).reshape(shape)
    keys |= (np.uint64(0xFFFFFFFF) - index) if largest else index
    return keys


def _topk_indices(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    n = x.shape[axis]
    keys = _order_keys(x, axis, largest)
    if keys is not None:  # O(n) selection, then a sort of the k picked
        if k == 0:
            return np.take(np.zeros(x.shape, np.int64), np.arange(0), axis=axis)
        picked = np.argpartition(keys, n - k if largest else k - 1, axis=axis)
        picked = np.take(picked, np.arange(n - k, n) if largest else np.arange(k), axis=axis)
        order = np.argsort(np.take_along_axis(keys, picked, axis=axis), axis=axis)
        if largest:
            order = np.flip(order, axis)
        return np.take_along_axis(picked, order, axis=axis)
    if largest:
        # a stable ascending sort of the reversed axis, read backwards, is a
        # descending sort in which ties keep ascending index order
        order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        return (n - 1) - np.flip(np.take(order, np.arange(n - k, n), axis=axis), axis)
    return np.take(np.argsort(x, axis=axis, kind="stable"), np.arange(k), axis=axis)


def _build_topk(op, opset: int) -> Kernel:
    """TopK: the k largest (or smallest) values along ``axis`` and their int64 indices.

    Sorted by value; equal values keep ascending index order, like onnxruntime.
    ``sorted=0`` also returns sorted results (ONNX leaves the order open).
    """
    axis = int(attribute(op, "axis", -1))
    largest = bool(attribute(op, "largest", 1))
    attribute_k = attribute(op, "k", None)

    def kernel(inputs):
        x = inputs[0]
        k = attribute_k if len(inputs) < 2 or inputs[1] is None else np.asarray(inputs[1]).reshape(-1)[0]
        if k is None:
            raise unsupported(op, "k is neither an input nor an attribute")
        if not -x.ndim <= axis < x.ndim:
            raise unsupported(op, f"axis {axis} is out of range for rank {x.ndim}")
        a = normalize_axis(axis, x.ndim)
        k = int(k)
        if not 0 <= k <= x.shape[a]:
            raise unsupported(op, f"k={k} is outside [0, {x.shape[a]}] for axis {a} of shape {list(x.shape)}")
        indices = _topk_indices(x, k, a, largest).astype(np.int64, copy=False)
        return [np.take_along_axis(x, indices, axis=a), indices]
    return kernel


KERNELS: dict = {name: by_opset({1: _build_reduce_1, 13 if name == "ReduceSum" else 18: _build_reduce_18})
                 for name in _REDUCERS}
KERNELS.update({"ArgMax": _build_arg, "ArgMin": _build_arg, "TopK": _build_topk})
