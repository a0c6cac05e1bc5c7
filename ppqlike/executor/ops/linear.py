"""Kernels of the linear family: Gemm and MatMul.

Gemm: ``Y = alpha * A' @ B' + beta * C`` with ``A'``/``B'`` optionally
transposed and ``C`` optional and broadcast to [M, N] (the unidirectional
rule).  MatMul follows numpy's matmul exactly (1-D operands, batch
broadcasting), which is ONNX's definition.  Results keep the input dtype.
"""

from __future__ import annotations

import numpy as np

from ._threads import num_threads, parallel, split_evenly
from .base import Kernel, attribute, unsupported

_SPLIT_ABOVE = 1 << 21    # multiply-adds from which a product is split over the kernel threads
_ROW_PIECES = 8           # a large product by a matrix is cut into this many row pieces: a constant, not the
                          # thread count, since OpenBLAS's sums depend on the cuts and results must not


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)``, split over ``PPQLIKE_NUM_THREADS`` Python threads when it is large (BLAS then runs
    single-threaded, see ``_threads.py``): by rows of ``a`` when ``b`` is a matrix (always the same
    ``_ROW_PIECES`` pieces, whatever the thread count), else by the leading batch dimension (the same
    products, each piece a BLAS call on fewer rows)."""
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return np.matmul(a, b)
    rows = int(np.prod(a.shape[:-1]))
    if rows * a.shape[-1] * b.shape[-1] < _SPLIT_ABOVE:
        return np.matmul(a, b)
    if b.ndim == 2:
        left = a.reshape(rows, a.shape[-1])
        out = np.empty(a.shape[:-1] + (b.shape[-1],), np.result_type(a, b))
        flat = out.reshape(rows, b.shape[-1])
        parallel(lambda part: np.matmul(left[part[0]:part[1]], b, out=flat[part[0]:part[1]]),
                 split_evenly(rows, _ROW_PIECES))
        return out
    threads = num_threads()
    if threads < 2:
        return np.matmul(a, b)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if a.ndim != b.ndim or not shape or shape[0] < threads:
        return np.matmul(a, b)
    a = np.broadcast_to(a, shape + a.shape[-2:])
    b = np.broadcast_to(b, shape + b.shape[-2:])
    out = np.empty(shape + (a.shape[-2], b.shape[-1]), np.result_type(a, b))
    parallel(lambda part: np.matmul(a[part[0]:part[1]], b[part[0]:part[1]], out=out[part[0]:part[1]]),
             split_evenly(shape[0], threads))
    return out


def _build_gemm(op, opset: int) -> Kernel:
    alpha = float(attribute(op, "alpha", 1.0))
    beta = float(attribute(op, "beta", 1.0))
    trans_a = int(attribute(op, "transA", 0))
    trans_b = int(attribute(op, "transB", 0))

    def kernel(inputs):
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        if a.ndim != 2 or b.ndim != 2:
            raise unsupported(op, f"Gemm of operands of rank {a.ndim} and {b.ndim} (both must be 2-D)")
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if a.shape[1] != b.shape[0]:
            raise unsupported(op, f"Gemm of shapes {list(a.shape)} and {list(b.shape)} after transposition")
        dtype = np.result_type(a.dtype, b.dtype)
        y = matmul(a, b)
        if alpha != 1.0:
            np.multiply(y, np.asarray(alpha).astype(dtype), out=y, casting="unsafe")
        if c is not None and beta != 0.0:
            shape = (a.shape[0], b.shape[1])
            if np.broadcast_shapes(c.shape, shape) != shape:
                raise unsupported(op, f"Gemm bias of shape {list(c.shape)} does not broadcast to {list(shape)}")
            term = c if beta == 1.0 else c * np.asarray(beta).astype(c.dtype)
            np.add(y, term, out=y, casting="unsafe")
        return [y.astype(dtype, copy=False)]
    return kernel


def _build_matmul(op, opset: int) -> Kernel:
    def kernel(inputs):
        a, b = inputs[0], inputs[1]
        if a.ndim == 0 or b.ndim == 0:
            raise unsupported(op, "MatMul of a scalar (operands must have rank 1 or more)")
        return [np.asarray(matmul(a, b))]
    return kernel


KERNELS: dict = {
    "Gemm": _build_gemm,
    "MatMul": _build_matmul,
}
