"""Op kernels, one module per op family, merged into one read-only table.

The table is built here, explicitly, from each family's ``KERNELS``; nothing
registers itself at import time.  :data:`REFUSED_OP_TYPES` names the default-domain
ops the executor refuses on purpose, with the reason its error gives.
"""

from __future__ import annotations

from types import MappingProxyType

from ...core.errors import UnsupportedOperationError
from ...core.ir import Operation
from . import (activation, algebra, arithmetic, attention, bitwise, control_flow, conv, detection, generator,
               indexing, linear, logic, loss, normalization, pooling, quantization, recurrent, reduction, resize,
               sampling, selection, sequence, signal, tensor, text, trigonometry)
from .base import Kernel, KernelBuilder

_FAMILIES = (activation, algebra, arithmetic, attention, bitwise, control_flow, conv, detection, generator,
             indexing, linear, logic, loss, normalization, pooling, quantization, recurrent, reduction, resize,
             sampling, selection, sequence, signal, tensor, text, trigonometry)

_RANDOM = ("draws new random numbers on every run, so calibration, its checks and the exported model's "
           "verification could not repeat; replace it by a constant (or feed the numbers as an input)")
_DEPRECATED = ("is deprecated since opset {since}: no model of the opsets ppqlike reads (11-23) can hold it "
               "(onnx.checker and onnxruntime refuse it there); {instead} replaces it")

#: Default-domain ops refused by name -> why (the executor's error says it).
REFUSED_OP_TYPES = MappingProxyType({
    "RandomNormal": _RANDOM,
    "RandomNormalLike": _RANDOM,
    "RandomUniform": _RANDOM,
    "RandomUniformLike": _RANDOM,
    "Multinomial": _RANDOM,
    "Bernoulli": _RANDOM,
    "ImageDecoder": ("decodes image files (onnxruntime has no CPU kernel for it, and the codecs are outside "
                     "ppqlike's dependencies); decode the images before the model and feed the pixels"),
    "Upsample": _DEPRECATED.format(since=10, instead="Resize"),
    "Scatter": _DEPRECATED.format(since=11, instead="ScatterElements"),
})


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
    if op.type in REFUSED_OP_TYPES:
        raise UnsupportedOperationError(
            f"node {op.name!r} has op type {op.type!r} (domain 'ai.onnx'), which ppqlike refuses: it "
            f"{REFUSED_OP_TYPES[op.type]}")
    if builder is None:
        raise UnsupportedOperationError(
            f"node {op.name!r} has op type {op.type!r} (domain 'ai.onnx'), which the executor does "
            f"not implement; supported types: {', '.join(sorted(KERNEL_BUILDERS))}")
    return builder(op, opset)


__all__ = ["KERNEL_BUILDERS", "REFUSED_OP_TYPES", "SUPPORTED_OP_TYPES", "build_kernel", "Kernel", "KernelBuilder"]
