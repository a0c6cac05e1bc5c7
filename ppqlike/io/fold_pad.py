"""Fold a zero constant Pad into the Conv that reads it: the Conv's own pads do the same.

EfficientNet-style exports pad explicitly before every "same" convolution; as
Conv pads the padding costs nothing at run time and leaves one op fewer to
quantize.  Padding with zeros is exact under quantization too (0 is on every
grid), which is why only a zero constant Pad is folded.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Graph, Operation
from .format_report import FormatReport, finish_report, remove_dead_code, start_report

DEFAULT_DOMAINS = ("", "ai.onnx")


def _spatial_pads(pad: Operation, rank: int) -> list[int] | None:
    """The Pad's amounts as Conv pads (begins then ends of the spatial axes), or None if not foldable."""
    if pad.attributes.get("mode", "constant") not in ("constant", b"constant"):
        return None
    inputs = pad.inputs + [None] * (4 - len(pad.inputs))
    amounts, value, axes = inputs[1], inputs[2], inputs[3]
    if amounts is None or not amounts.is_parameter:
        return None
    if value is not None and (not value.is_parameter or np.any(value.value != 0)):
        return None
    amounts = np.asarray(amounts.value, np.int64).reshape(-1)
    axes_list = list(range(rank)) if axes is None else (
        [int(a) % rank for a in np.asarray(axes.value).reshape(-1)] if axes.is_parameter else None)
    if axes_list is None or amounts.size != 2 * len(axes_list) or np.any(amounts < 0):
        return None
    begins, ends = dict(zip(axes_list, amounts[:len(axes_list)])), dict(zip(axes_list, amounts[len(axes_list):]))
    if begins.get(0, 0) or ends.get(0, 0) or begins.get(1, 0) or ends.get(1, 0):
        return None  # batch or channel padding is not a convolution's business
    return [int(begins.get(a, 0)) for a in range(2, rank)] + [int(ends.get(a, 0)) for a in range(2, rank)]


def fold_pad_into_conv(graph: Graph) -> FormatReport:
    """Remove zero constant Pads read by Conv ops only, adding their amounts to each Conv's pads."""
    report = start_report(graph)
    for pad in graph.topological_sort():
        if pad.type != "Pad" or pad.domain not in DEFAULT_DOMAINS or pad.outputs[0] in graph.outputs:
            continue
        readers = pad.outputs[0].consumers
        if not readers or any(r.type != "Conv" or r.inputs[0] is not pad.outputs[0]
                              or r.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
                              for r in readers):
            continue
        weight = readers[0].inputs[1]
        rank = None if weight is None or weight.value is None else weight.value.ndim
        extra = None if rank is None else _spatial_pads(pad, rank)
        if extra is None:
            report.skipped["Pad that is not a zero constant on spatial axes"] += 1
            continue
        source = pad.inputs[0]
        for conv in list(readers):
            own = list(conv.attributes.get("pads", [0] * len(extra)))
            conv.attributes["pads"] = [a + b for a, b in zip(own, extra)]
            graph.replace_input(conv, 0, source)
        graph.remove_operation(pad)
        report.counts["Pad folded into Conv pads"] += 1
    report.counts.update(remove_dead_code(graph).counts)
    return finish_report(graph, report)
