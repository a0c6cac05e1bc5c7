"""The uniform kernel interface shared by every op family module.

A *kernel builder* takes an :class:`~ppqlike.core.ir.Operation` and the graph's
opset and returns a *kernel*: a function from the list of input arrays (``None``
for an omitted optional input) to the list of output arrays.  Builders parse
attributes once, when the execution plan is compiled, and raise
:class:`UnsupportedOperationError` for attribute values they cannot run, so a
bad graph fails before any data runs.  Kernels never modify their inputs.

Each family module exports ``KERNELS: dict[str, KernelBuilder]``;
``ppqlike.executor.ops`` merges them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...core.errors import UnsupportedOperationError
from ...core.ir import Operation

Kernel = Callable[[Sequence[Optional[np.ndarray]]], list]
KernelBuilder = Callable[[Operation, int], Kernel]

_REQUIRED = object()


def attribute(op: Operation, name: str, default: Any = _REQUIRED) -> Any:
    """Read attribute ``name`` of ``op``; a missing required one is an UnsupportedOperationError."""
    if name in op.attributes:
        return op.attributes[name]
    if default is _REQUIRED:
        raise UnsupportedOperationError(
            f"{op.type} node {op.name!r}: required attribute {name!r} is missing")
    return default


def unsupported(op: Operation, what: str) -> UnsupportedOperationError:
    """An error for an attribute value or input combination the kernel cannot run."""
    return UnsupportedOperationError(f"{op.type} node {op.name!r} (domain {op.domain or 'ai.onnx'!r}): {what}")


def by_opset(variants: dict[int, KernelBuilder]) -> KernelBuilder:
    """A builder choosing among an op's opset variants (since-version -> builder; onnx's reference
    evaluator names them ``Op_6``, ``Op_11``, ...): the newest variant not newer than the model's opset."""
    since = sorted(variants)

    def build(op: Operation, opset: int) -> Kernel:
        chosen = [version for version in since if version <= opset] or since[:1]
        return variants[chosen[-1]](op, opset)
    return build


def unary(function: Callable[[np.ndarray], np.ndarray]) -> KernelBuilder:
    """Builder for a one-input, one-output op without attributes."""
    def build(op: Operation, opset: int) -> Kernel:
        return lambda inputs: [function(inputs[0])]
    return build


def binary(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> KernelBuilder:
    """Builder for a broadcasting two-input, one-output op without attributes."""
    def build(op: Operation, opset: int) -> Kernel:
        return lambda inputs: [function(inputs[0], inputs[1])]
    return build


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative ONNX axis into ``range(rank)``."""
    return axis + rank if axis < 0 else axis
