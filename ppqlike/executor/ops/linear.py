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


def matmul(a: np.ndarray, b: np.ndarray, epilogue=None) -> np.ndarray:
    """``np.matmul(a, b)``, split over ``PPQLIKE_NUM_THREADS`` Python threads when it is large (BLAS then runs
    single-threaded, see ``_threads.py``): by rows of ``a`` when ``b`` is a matrix (always the same
    ``_ROW_PIECES`` pieces, whatever the thread count), else by the leading batch dimension (the same
    products, each piece a BLAS call on fewer rows).  ``epilogue(block)``: elementwise work done in place
    on each piece of a float32 product as soon as it is made, while it is in cache (on the whole product
    otherwise)."""
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return _finished(np.asarray(np.matmul(a, b)), epilogue)
    inner = epilogue if np.result_type(a, b) == np.float32 else None
    rows = int(np.prod(a.shape[:-1]))
    if rows * a.shape[-1] * b.shape[-1] < _SPLIT_ABOVE:
        return _finished(np.matmul(a, b), epilogue)
    if b.ndim == 2:
        left = a.reshape(rows, a.shape[-1])
        out = np.empty(a.shape[:-1] + (b.shape[-1],), np.result_type(a, b))
        flat = out.reshape(rows, b.shape[-1])

        def piece(part):
            np.matmul(left[part[0]:part[1]], b, out=flat[part[0]:part[1]])
            _finished(flat[part[0]:part[1]], inner)
        parallel(piece, split_evenly(rows, _ROW_PIECES))
        return out if inner is not None else _finished(out, epilogue)
    threads = num_threads()
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if threads < 2 or a.ndim != b.ndim or not shape or shape[0] < threads:
        return _finished(np.matmul(a, b), epilogue)
    a = np.broadcast_to(a, shape + a.shape[-2:])
    b = np.broadcast_to(b, shape + b.shape[-2:])
    out = np.empty(shape + (a.shape[-2], b.shape[-1]), np.result_type(a, b))

    def batch(part):
        np.matmul(a[part[0]:part[1]], b[part[0]:part[1]], out=out[part[0]:part[1]])
        _finished(out[part[0]:part[1]], inner)
    parallel(batch, split_evenly(shape[0], threads))
    return out if inner is not None else _finished(out, epilogue)


def _finished(product: np.ndarray, epilogue) -> np.ndarray:
    """``product`` after ``epilogue`` (in place; none: as it is)."""
    if epilogue is not None:
        epilogue(product)
    return product


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
    def kernel(inputs, epilogue=None, extra_pads=None):
        """``epilogue``: elementwise work on the product, in place, piece by piece (``matmul``)."""
        a, b = inputs[0], inputs[1]
        if a.ndim == 0 or b.ndim == 0:
            raise unsupported(op, "MatMul of a scalar (operands must have rank 1 or more)")
        if extra_pads is not None:
            raise unsupported(op, "a folded Pad (only convolutions take one)")
        return [matmul(a, b, epilogue)]
    kernel.takes_epilogue = True
    return kernel


KERNELS: dict = {
    "Gemm": _build_gemm,
    "MatMul": _build_matmul,
}
