"""Kernels of the trigonometric family: Sin, Cos, Tan, their inverses, and the hyperbolic functions.

Outputs keep the input dtype.  float16 is computed in float32 and rounded once, as onnxruntime
does; values outside an inverse's domain give NaN, not an error.  The opset 22 versions only add
bfloat16, so one kernel serves every opset.
"""

from __future__ import annotations

import numpy as np

from .base import unary

_QUIET = dict(all="ignore")


def _elementwise(function):
    """``function`` applied in the input's float dtype (float16 through float32), result as an ndarray."""
    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(**_QUIET):
            if x.dtype == np.float16:
                return np.asarray(function(x.astype(np.float32)).astype(np.float16))
            return np.asarray(function(x))
    return run


KERNELS: dict = {
    "Sin": unary(_elementwise(np.sin)),
    "Cos": unary(_elementwise(np.cos)),
    "Tan": unary(_elementwise(np.tan)),
    "Asin": unary(_elementwise(np.arcsin)),
    "Acos": unary(_elementwise(np.arccos)),
    "Atan": unary(_elementwise(np.arctan)),
    "Sinh": unary(_elementwise(np.sinh)),
    "Cosh": unary(_elementwise(np.cosh)),
    "Asinh": unary(_elementwise(np.arcsinh)),
    "Acosh": unary(_elementwise(np.arccosh)),
    "Atanh": unary(_elementwise(np.arctanh)),
}
