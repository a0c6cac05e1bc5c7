"""Kernels of the logic op family: comparisons, boolean ops, Where and the
variadic elementwise Max/Min/Sum/Mean.

Comparisons and boolean ops return bool arrays; everything broadcasts
numpy-style (the ONNX multidirectional rule).
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, binary, unary


def _array(function):
    """``function`` returning an ndarray (ufuncs give numpy scalars for 0-d inputs)."""
    def run(*arrays):
        result = function(*arrays)
        return result if type(result) is np.ndarray else np.asarray(result)
    return run


def _variadic(function, mean: bool = False):
    """Builder folding ``function`` over all inputs (Max, Min, Sum); Mean divides by their count."""
    def build(op, opset: int) -> Kernel:
        def kernel(inputs):
            arrays = [a for a in inputs if a is not None]
            if len(arrays) == 1:
                out = np.array(arrays[0], copy=True)
            else:
                out = np.asarray(function(arrays[0], arrays[1]))
            for array in arrays[2:]:
                if np.broadcast_shapes(out.shape, array.shape) == out.shape:
                    function(out, array, out=out)
                else:
                    out = function(out, array)
            if mean:
                out /= len(arrays)
            return [out]
        return kernel
    return build


def _build_is_inf(op, opset: int) -> Kernel:
    """IsInf: x == +inf (if detect_positive) or x == -inf (if detect_negative)."""
    positive = int(attribute(op, "detect_positive", 1))
    negative = int(attribute(op, "detect_negative", 1))

    def kernel(inputs):
        x = inputs[0]
        if positive and negative:
            return [np.asarray(np.isinf(x))]
        if positive:
            return [np.asarray(x == np.inf)]
        if negative:
            return [np.asarray(x == -np.inf)]
        return [np.zeros(x.shape, bool)]
    return kernel


def _where(condition, x, y):
    """Where: x where condition else y, all three broadcast together."""
    return np.where(condition, x, y)


KERNELS: dict = {
    "Equal": binary(_array(np.equal)),
    "Greater": binary(_array(np.greater)),
    "Less": binary(_array(np.less)),
    "GreaterOrEqual": binary(_array(np.greater_equal)),
    "LessOrEqual": binary(_array(np.less_equal)),
    "Not": unary(_array(np.logical_not)),
    "And": binary(_array(np.logical_and)),
    "Or": binary(_array(np.logical_or)),
    "Xor": binary(_array(np.logical_xor)),
    "IsNaN": unary(_array(np.isnan)),
    "IsInf": _build_is_inf,
    "Where": lambda op, opset: lambda inputs: [_where(inputs[0], inputs[1], inputs[2])],
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sum": _variadic(np.add),
    "Mean": _variadic(np.add, mean=True),
}
