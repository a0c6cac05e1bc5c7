"""Op kernels, one module per op family, merged into one read-only table.

The table is built here, explicitly, from each family's ``KERNELS``; nothing
registers itself at import time.
"""

from __future__ import annotations

from types import MappingProxyType

from ...core.errors import UnsupportedOperationError
from ...core.ir import Operation
from . import (activation, algebra, arithmetic, attention, bitwise, conv, detection, generator, indexing, linear, logic, loss,
               normalization, pooling, quantization, reduction, resize, sampling, selection, signal, tensor, text, trigonometry)
from .base import Kernel, KernelBuilder

_FAMILIES = (activation, algebra, arithmetic, attention, bitwise, conv, detection, generator, indexing, linear, logic, loss,
             normalization, pooling, quantization, reduction, resize, sampling, selection, signal, tensor, text, trigonometry)


def _merge() -> MappingProxyType:
    table: dict[str, KernelBuilder] = {}
    for family in _FAMILIES:
        for op_type, builder in family.KERNELS.items():
            if op_type in table:
                raise RuntimeError(f"op type {op_type} is defined by two families")
            table[op_type] = builder
    return MappingProxyType(table)


KERNEL_BUILDERS = _merge()
SUPPORTED_OP_TYPES = frozenset(KERNEL_BUILDERS)


def build_kernel(op: Operation, opset: int) -> Kernel:
    """Compile the kernel of ``op``; unknown ops raise an error naming type, node and domain."""
    if op.domain not in ("", "ai.onnx"):
        raise UnsupportedOperationError(
            f"node {op.name!r} has op type {op.type!r} of domain {op.domain!r}: ppqlike runs only "
            "the default ONNX domain; replace the node or export the model without custom ops")
    builder = KERNEL_BUILDERS.get(op.type)
    if builder is None:
        raise UnsupportedOperationError(
            f"node {op.name!r} has op type {op.type!r} (domain 'ai.onnx'), which the executor does "
            f"not implement; supported types: {', '.join(sorted(KERNEL_BUILDERS))}")
    return builder(op, opset)


__all__ = ["KERNEL_BUILDERS", "SUPPORTED_OP_TYPES", "build_kernel", "Kernel", "KernelBuilder"]
