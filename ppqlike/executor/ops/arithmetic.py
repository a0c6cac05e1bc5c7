"""Kernels of the arithmetic op family: elementwise math, Erf and Cast.

Binary ops broadcast numpy-style (the ONNX multidirectional rule).  Results keep
the input dtype like onnxruntime: integer Div truncates toward zero, integer
Mod follows the divisor's sign unless ``fmod=1``, float->int Cast truncates.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._threads import num_threads, parallel_over
from .base import Kernel, attribute, binary, unary, unsupported

_ERRSTATE = dict(all="ignore")  # overflow/inf/nan results are data, not errors


def _array(function, quiet: bool = False):
    """``function`` returning an ndarray (ufuncs give numpy scalars for 0-d inputs),
    with numpy floating-point warnings silenced when ``quiet``."""
    def run(*arrays):
        if quiet:
            with np.errstate(**_ERRSTATE):
                result = function(*arrays)
        else:
            result = function(*arrays)
        return result if type(result) is np.ndarray else np.asarray(result)
    return run


# ------------------------------------------------------------------ Div / Mod --
def _truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer a / b rounded toward zero (C semantics), from numpy's floor division."""
    quotient, remainder = np.divmod(a, b)
    if a.dtype.kind == "i" or b.dtype.kind == "i":
        # floor and trunc differ where the division is inexact and the signs differ
        fix = (remainder != 0) & ((a < 0) != (b < 0))
        if fix.any():
            quotient += fix.astype(quotient.dtype)
    return quotient


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(**_ERRSTATE):
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            return _truncating_divide(a, b)
        return np.divide(a, b)


def _build_mod(op, opset: int) -> Kernel:
    fmod = int(attribute(op, "fmod", 0))

    def kernel(inputs):
        a, b = inputs[0], inputs[1]
        with np.errstate(**_ERRSTATE):
            if fmod:
                return [np.asarray(np.fmod(a, b))]
            if a.dtype.kind == "f":
                raise unsupported(op, "fmod=0 is only defined for integer inputs; floats need fmod=1")
            return [np.asarray(np.mod(a, b))]
    return kernel


# ------------------------------------------------------------------------ Pow --
def _power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """base ** exponent with the result in base's dtype (opset 12+ allows mixed dtypes)."""
    with np.errstate(**_ERRSTATE):
        if base.dtype.kind == "f":
            if exponent.size == 1 and exponent.ndim <= base.ndim and exponent.item() in (2, 3):
                # onnxruntime's fast paths too; generic float pow is ~100x slower
                out = np.square(base, out=np.empty_like(base))
                return out if exponent.item() == 2 else np.multiply(out, base, out=out)
            return np.power(base, exponent.astype(base.dtype, copy=False))
        # integer base: like onnxruntime, std::pow in double, then a C cast
        # (x ** -n truncates to 0; overflow and 0 ** -n give INT_MIN)
        return np.power(base.astype(np.float64), exponent.astype(np.float64)).astype(base.dtype)


# ------------------------------------------------------------------------ Erf --
# W. J. Cody's rational Chebyshev approximations (CALERF, Math. Comp. 1969),
# relative error below 1e-16 in double precision.
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1
_SMALL, _LARGE = 0.46875, 4.0


def _erf_small(y: np.ndarray) -> np.ndarray:
    """erf(y) for |y| <= 0.46875."""
    ysq = y * y
    num, den = _A[4] * ysq, ysq.copy()
    for i in range(3):
        num += _A[i]
        num *= ysq
        den += _B[i]
        den *= ysq
    return y * (num + _A[3]) / (den + _B[3])


def _erfc_mid(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 0.46875 < y <= 4."""
    num, den = _C[8] * y, y.copy()
    for i in range(7):
        num += _C[i]
        num *= y
        den += _D[i]
        den *= y
    return np.exp(-y * y) * (num + _C[7]) / (den + _D[7])


def _erfc_large(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 4."""
    inv = 1.0 / (y * y)
    num, den = _P[5] * inv, inv.copy()
    for i in range(4):
        num += _P[i]
        num *= inv
        den += _Q[i]
        den *= inv
    tail = inv * (num + _P[4]) / (den + _Q[4])
    return np.exp(-y * y) * (_INV_SQRT_PI - tail) / y


def _erf_or_erfc(x: np.ndarray, complement: bool) -> np.ndarray:
    """erf(x) (or erfc(x)) in float64, piecewise over |x|."""
    shape = np.shape(x)
    x = np.asarray(x, dtype=np.float64).reshape(-1)  # 1-D: no 0-d scalars
    y = np.abs(x)
    small = y <= _SMALL
    large = y > _LARGE
    mid = ~(small | large)
    out = np.empty_like(y)
    with np.errstate(**_ERRSTATE):
        if small.any():
            out[small] = _erf_small(y[small])
            if complement:
                out[small] = 1.0 - out[small]
        for mask, tail in ((mid, _erfc_mid), (large, _erfc_large)):
            if mask.any():
                out[mask] = tail(y[mask]) if complement else 1.0 - tail(y[mask])
        out[np.isnan(y)] = np.nan
    if complement:  # erfc(-y) = 2 - erfc(y)
        return np.subtract(2.0, out, out=out, where=x < 0).reshape(shape)
    return np.copysign(out, x, out=out).reshape(shape)


# float32 path: x * P(x^2) / Q(x^2) on |x| <= 4 (Eigen's generic_fast_erf_float),
# evaluated in double: |error| < 7e-8, about one float32 ulp just below 1.
_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
         -7.37332916720468e-03, -1.42647390514189e-02)


def _erf_fast(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """erf(scale * x) in float64 for single-precision data, without branches."""
    shape = np.shape(x)
    x = np.multiply(x, scale, out=np.empty(shape, np.float64)).reshape(-1)  # 1-D: no 0-d scalars
    np.clip(x, -_LARGE, _LARGE, out=x)
    t = x * x
    numerator = t * _ALPHA[0]
    for c in _ALPHA[1:-1]:
        numerator += c
        numerator *= t
    numerator += _ALPHA[-1]
    numerator *= x
    saturated = t >= _LARGE * _LARGE  # erf(4) = 1 - 1.5e-8: exactly +-1 in single precision
    denominator = np.multiply(t, _BETA[0], out=x)  # x is no longer needed
    for c in _BETA[1:-1]:
        denominator += c
        denominator *= t
    denominator += _BETA[-1]
    out = np.divide(numerator, denominator, out=numerator)
    if saturated.any():
        out[saturated] = np.sign(out[saturated])
    return out.reshape(shape)


_BLOCK = 1 << 15           # elements per block: keeps multi-pass float64 work inside the L2 cache
_THREAD_BLOCK = 1 << 17    # elements per block when blocks run on several threads


def blockwise(x: np.ndarray, compute, dtype) -> np.ndarray:
    """``compute`` applied to consecutive flat blocks of ``x``, results stored as ``dtype``.

    For elementwise functions made of many numpy passes: working block by block
    keeps temporaries in cache (2-3x faster on large activations).  With several
    kernel threads the blocks are larger and shared out among them (numpy
    releases the GIL inside each pass; larger blocks make fewer, longer passes,
    so the threads rarely wait for it: Erf on a ViT-S MLP activation 31-36 ms ->
    18-20 ms on 2 threads).
    """
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, dtype)
    threads = num_threads()
    size = _THREAD_BLOCK if threads > 1 and flat.size > _THREAD_BLOCK else _BLOCK

    def block(start):
        out[start:start + size] = compute(flat[start:start + size])
    parallel_over(block, range(0, flat.size, size), threads if size == _THREAD_BLOCK else 1)
    return out.reshape(x.shape)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in ``x``'s float dtype (double-precision accurate for float64)."""
    if x.dtype == np.float64:
        return _erf_or_erfc(x, False)
    return blockwise(x, _erf_fast, x.dtype if x.dtype.kind == "f" else np.float64)


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function 1 - erf(x) without cancellation, in float64."""
    return _erf_or_erfc(x, True)


# ----------------------------------------------------------------------- Cast --
# onnxruntime's float->narrow-int casts go through a wider C integer and wrap.
_CAST_VIA = {np.dtype(np.int8): np.int32, np.dtype(np.uint8): np.int32,
             np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.int32,
             np.dtype(np.uint32): np.int64, np.dtype(np.uint64): np.int64}


def _cast(x: np.ndarray, target: np.dtype) -> np.ndarray:
    with np.errstate(**_ERRSTATE):
        if x.dtype.kind == "f" and target in _CAST_VIA:
            return x.astype(_CAST_VIA[target]).astype(target)
        return x.astype(target)


def _dtype_of(op, tensor_type: int) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(tensor_type)))
    except (KeyError, ValueError, TypeError) as error:
        raise unsupported(op, f"unknown ONNX tensor type {tensor_type}") from error
    if dtype.kind not in "biufc":
        raise unsupported(op, f"casting to {dtype} (ONNX type {tensor_type}) is not supported")
    return dtype


def _build_cast(op, opset: int) -> Kernel:
    target = _dtype_of(op, attribute(op, "to"))
    return lambda inputs: [_cast(inputs[0], target)]


def _build_cast_like(op, opset: int) -> Kernel:
    return lambda inputs: [_cast(inputs[0], inputs[1].dtype)]


KERNELS: dict = {
    "Add": binary(_array(np.add)),
    "Sub": binary(_array(np.subtract)),
    "Mul": binary(_array(np.multiply)),
    "Div": binary(_array(_divide)),
    "Mod": _build_mod,
    "Pow": binary(_array(_power)),
    "Sqrt": unary(_array(np.sqrt, True)),
    "Exp": unary(_array(np.exp, True)),
    "Log": unary(_array(np.log, True)),
    "Erf": unary(erf),
    "Neg": unary(_array(np.negative)),
    "Abs": unary(_array(np.abs)),
    "Reciprocal": unary(_array(lambda x: np.divide(1, x, dtype=x.dtype), True)),
    "Floor": unary(_array(np.floor)),
    "Ceil": unary(_array(np.ceil)),
    "Round": unary(_array(np.round)),  # half to even, like ONNX
    "Sign": unary(_array(np.sign)),
    "Cast": _build_cast,
    "CastLike": _build_cast_like,
}
