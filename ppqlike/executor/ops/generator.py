"""Kernels of the generator family: Constant, ConstantOfShape, Range, EyeLike."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .base import attribute, unsupported


def _onnx_dtype(op, code):
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))
    except Exception:
        raise unsupported(op, f"ONNX element type {code}") from None


def _constant(op, opset):
    known = {"value": None, "value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    present = [name for name in known if name in op.attributes]
    if len(present) != 1:
        raise unsupported(op, f"needs exactly one of {sorted(known)} (has {sorted(op.attributes)})")
    name = present[0]
    raw = op.attributes[name]
    value = np.asarray(raw) if known[name] is None else np.array(raw, dtype=known[name])
    value.setflags(write=False)
    return lambda inputs: [value]


def _constant_of_shape(op, opset):
    value = attribute(op, "value", None)
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise unsupported(op, f"value must hold one element, it has {value.size}")
    fill = value.reshape(())

    def kernel(inputs):
        shape = [int(d) for d in np.asarray(inputs[0]).reshape(-1)]
        return [np.full(shape, fill, dtype=fill.dtype)]
    return kernel


def _range(op, opset):
    def kernel(inputs):
        start, limit, delta = (np.asarray(a).reshape(()) for a in inputs[:3])
        dtype = start.dtype
        span = (limit - start).astype(dtype)
        count = max(int(math.ceil(float(span) / float(delta))), 0)
        if np.issubdtype(dtype, np.floating):
            steps = np.full(count, delta, dtype=dtype)  # accumulate like onnxruntime
            if count:
                steps[0] = start
            return [np.cumsum(steps, dtype=dtype)]
        return [(start + np.arange(count, dtype=dtype) * delta).astype(dtype)]
    return kernel


def _eye_like(op, opset):
    k = int(attribute(op, "k", 0))
    code = attribute(op, "dtype", None)
    dtype = None if code is None else _onnx_dtype(op, code)

    def kernel(inputs):
        x = inputs[0]
        if x.ndim != 2:
            raise unsupported(op, f"input of rank {x.ndim} (EyeLike needs rank 2)")
        return [np.eye(x.shape[0], x.shape[1], k=k, dtype=x.dtype if dtype is None else dtype)]
    return kernel


KERNELS: dict = {
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "EyeLike": _eye_like,
}
