"""Op kernels, one module per op family, merged into one read-only table.

The table is built here, explicitly, from each family's ``KERNELS``; nothing
registers itself at import time.  :data:`REFUSED_OP_TYPES` names the default-domain
ops the executor refuses on purpose, with the reason its error gives.
"""

from __future__ import annotations

import difflib
from types import MappingProxyType

from ...core.errors import UnsupportedOperationError
from ...core.ir import Graph, Operation
from ...core.subgraphs import walk
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


def refusal(op: Operation) -> str | None:
    """Why the executor can never run ``op`` (its domain or type), in one line naming the node; None when
    it has a kernel (whose attributes are checked when the kernel is built)."""
    if op.domain not in ("", "ai.onnx"):
        return (f"node {op.name!r} has op type {op.type!r} of domain {op.domain!r}: ppqlike runs only "
                "the default ONNX domain; replace the node or export the model without custom ops")
    if op.type in REFUSED_OP_TYPES:
        return (f"node {op.name!r} has op type {op.type!r} (domain 'ai.onnx'), which ppqlike refuses: it "
                f"{REFUSED_OP_TYPES[op.type]}")
    if op.type not in KERNEL_BUILDERS:
        close = difflib.get_close_matches(op.type, KERNEL_BUILDERS, n=3)
        hint = f" (closest implemented: {', '.join(close)})" if close else ""
        return (f"node {op.name!r} has op type {op.type!r} (domain 'ai.onnx'), which the executor does not "
                f"implement{hint}")
    return None


def check_runnable(graph: Graph) -> None:
    """UnsupportedOperationError, in one line, naming the first op of ``graph`` or of its bodies that the
    executor can never run (:func:`refusal`) and counting the others; called when a model is loaded for
    quantization, before any calibration data is read."""
    refused = [(operation, why) for _, operation in walk(graph) if (why := refusal(operation)) is not None]
    if not refused:
        return
    operation, why = refused[0]
    others = ""
    if len(refused) > 1:
        types = sorted({op.type for op, _ in refused[1:]})
        shown = ", ".join(types[:5]) + (", ..." if len(types) > 5 else "")
        others = f"; {len(refused) - 1} other node(s) cannot run either (op types {shown})"
    where = f"model {graph.name!r}: " if graph.name else ""
    raise UnsupportedOperationError(f"{where}{why}{others}")


def build_kernel(op: Operation, opset: int) -> Kernel:
    """Compile the kernel of ``op``; unknown ops raise an error naming type, node and domain."""
    why = refusal(op)
    if why is not None:
        raise UnsupportedOperationError(why)
    return KERNEL_BUILDERS[op.type](op, opset)


__all__ = ["KERNEL_BUILDERS", "REFUSED_OP_TYPES", "SUPPORTED_OP_TYPES", "build_kernel", "check_runnable", "refusal",
           "Kernel", "KernelBuilder"]
