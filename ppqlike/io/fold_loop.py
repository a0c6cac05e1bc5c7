"""Loop-invariant constants out of the carried values of Loops.

Some exporters (paddle2onnx, for one) pass a Loop's weights through it as loop-carried values: the initial
value is a constant and the body hands its input back unchanged as the next value.  Inside the body such
a weight is then an input - an activation to every pass - so its MatMul could only quantize it as one.
:func:`fold_loop_invariants` makes each such value a parameter of the body (the same array) and drops it
from the Loop's carried values; the Loop's final value of it was the constant itself, which its readers now
read.  A carried value that is a graph output stays.  Part of graph formatting (:mod:`ppqlike.io.format`):
edits the graph through its editing API and returns a FormatReport.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Graph, Operation
from ..core.subgraphs import explicit_input_count, is_graph
from .format_report import FormatReport, finish_report, remove_dead_code, start_report


def _invariant_slots(graph: Graph, loop: Operation) -> list[int]:
    """Carried slots of ``loop`` whose initial value is a constant its body passes through unchanged."""
    body = loop.attributes["body"]
    slots = []
    for slot in range(len(body.inputs) - 2):
        initial = loop.inputs[2 + slot]
        passed = body.inputs[2 + slot] is body.outputs[1 + slot]
        final = loop.outputs[slot] if slot < len(loop.outputs) else None
        if initial is not None and initial.is_parameter and passed and (final is None or final not in graph.outputs):
            slots.append(slot)
    return slots


def _fold(graph: Graph, loop: Operation, slots: list[int]) -> None:
    body = loop.attributes["body"]
    count = explicit_input_count(loop)
    dropped = set(slots)
    initials = {slot: loop.inputs[2 + slot] for slot in slots}
    finals = {slot: loop.outputs[slot] for slot in slots if slot < len(loop.outputs)}
    inputs = loop.inputs[:2] + [v for slot, v in enumerate(loop.inputs[2:count]) if slot not in dropped] \
        + loop.inputs[count:]
    outputs = [v for slot, v in enumerate(loop.outputs) if slot not in dropped]
    attributes, name, domain = dict(loop.attributes), loop.name, loop.domain
    graph.remove_operation(loop, remove_unused_outputs=False)
    for slot in slots:
        variable = body.inputs[2 + slot]
        value = np.asarray(initials[slot].value)
        variable.value, variable.shape, variable.dtype = value, list(value.shape), value.dtype
    body.inputs = [v for index, v in enumerate(body.inputs) if index < 2 or index - 2 not in dropped]
    body.outputs = [v for index, v in enumerate(body.outputs) if index < 1 or index - 1 not in dropped]
    body.revision += 1
    for slot, final in finals.items():
        graph.replace_variable(final, initials[slot])
        graph.remove_variable(final)
    graph.create_operation("Loop", inputs, outputs, attributes=attributes, name=name, domain=domain)


def fold_loop_invariants(graph: Graph) -> FormatReport:
    """Make the constant weights a Loop carries unchanged through its body parameters of the body."""
    report = start_report(graph)
    for loop in graph.topological_sort():
        if loop.type != "Loop" or not is_graph(loop.attributes.get("body")):
            continue
        slots = _invariant_slots(graph, loop)
        if slots:
            _fold(graph, loop, slots)
            report.counts["loop-invariant carried constants made body parameters"] += len(slots)
    report.counts.update(remove_dead_code(graph).counts)
    return finish_report(graph, report)
