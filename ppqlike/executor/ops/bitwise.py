"""Kernels of the bitwise family: BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot.

Integer tensors only; two-input ops broadcast numpy-style and keep the input dtype.  BitShift
(unsigned types) gives 0 for a shift by the type's width or more, where C leaves it undefined.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, binary, unary, unsupported


def _same_dtype(function):
    """``function(a, b)`` as an ndarray of ``a``'s dtype (numpy returns scalars for 0-d inputs)."""
    return lambda a, b: np.asarray(function(a, b), dtype=a.dtype)


def _shift(x: np.ndarray, amount: np.ndarray, left: bool) -> np.ndarray:
    """x << amount or x >> amount elementwise; shifts by the width or more give 0."""
    width = np.iinfo(x.dtype).bits
    amount = np.asarray(amount)
    too_far = amount >= width
    safe = np.where(too_far, 0, amount).astype(x.dtype)
    shifted = np.left_shift(x, safe) if left else np.right_shift(x, safe)
    return np.asarray(np.where(too_far, x.dtype.type(0), shifted), dtype=x.dtype)


def _build_bit_shift(op, opset: int) -> Kernel:
    direction = attribute(op, "direction")
    if direction not in ("LEFT", "RIGHT"):
        raise unsupported(op, f"direction {direction!r} (expected 'LEFT' or 'RIGHT')")
    left = direction == "LEFT"

    def kernel(inputs):
        x, amount = inputs[0], inputs[1]
        if x.dtype.kind != "u":
            raise unsupported(op, f"input of type {x.dtype} (BitShift takes unsigned integers)")
        return [_shift(x, amount, left)]
    return kernel


KERNELS: dict = {
    "BitShift": _build_bit_shift,
    "BitwiseAnd": binary(_same_dtype(np.bitwise_and)),
    "BitwiseOr": binary(_same_dtype(np.bitwise_or)),
    "BitwiseXor": binary(_same_dtype(np.bitwise_xor)),
    "BitwiseNot": unary(lambda x: np.asarray(np.invert(x), dtype=x.dtype)),
}
