"""The FP32 outputs the accuracy measures compare with, computed once per batch and shared.

The choice between observers ('auto'), the protection of sensitive layers and the verdict all compare the
quantized graph with its FP32 self on held-aside calibration samples.  :class:`FloatReferences` runs each
such batch in float once and keeps its outputs, so those three read one forward pass instead of one each,
and every one of them compares with the FP32 model as it was before any pass changed a float value (bias
correction writes its correction into biases that stay float, TensorRT's): the pass that would change one
calls :meth:`FloatReferences.keep` first.

A batch is known by its content (input names, shapes, dtypes and a CRC of the bytes), so the same samples
reach the same outputs however they were sliced or copied on the way.

Reads: the graph's configs (every one dequantized for the forward pass, restored exactly).  Writes nothing.
"""

from __future__ import annotations

import zlib
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from .sensitivity import held_aside_or_calibration


def batch_key(batch) -> tuple:
    """What identifies a batch's content: per input, its name (or position), shape, dtype and CRC-32."""
    if isinstance(batch, dict):
        items = sorted(batch.items(), key=lambda item: str(item[0]))
    elif isinstance(batch, (list, tuple)):
        items = list(enumerate(batch))
    else:
        items = [(0, batch)]
    key = []
    for name, value in items:
        array = np.ascontiguousarray(value)
        key.append((str(name), array.shape, array.dtype.str, zlib.crc32(array.view(np.uint8).reshape(-1))
                    if array.size else 0))
    return tuple(key)


class FloatReferences:
    """FP32 outputs of batches, each computed on first request (or by :meth:`keep`), the measured ones kept.

    ``measured``: the batches the protection and the verdict measure on (a callable returning them, called at
    the first request or :meth:`keep`, both after calibration has read the data, never before)."""

    def __init__(self, graph: Graph, executor: NumpyExecutor, measured: Callable[[], list] | None = None):
        self.graph, self.executor, self.measured = graph, executor, measured
        self._outputs: dict[tuple, list] = {}
        self._measured_keys: set | None = None

    def outputs(self, batch) -> list:
        """The FP32 outputs of ``batch`` (computed now if this content was never seen); kept when the batch is
        one of the measured ones (others, such as the observer choice's calibration batches, are not asked
        again: their outputs are not held)."""
        key = batch_key(batch)
        if key in self._outputs:
            return self._outputs[key]
        with dequantized(self.graph):
            outputs = self.executor.forward(batch)
        if self.measured is None or key in self._kept_keys():
            self._outputs[key] = outputs
        return outputs

    def _kept_keys(self) -> set:
        if self._measured_keys is None:
            self._measured_keys = {batch_key(batch) for batch in self.measured()}
        return self._measured_keys

    def keep(self) -> None:
        """Compute now the references of the measured batches (before a pass changes a float value)."""
        for batch in (self.measured() if self.measured is not None else ()):
            self.outputs(batch)


def references_of(batches: Iterable, graph: Graph, executor: NumpyExecutor,
                  references: FloatReferences | None) -> list:
    """The FP32 outputs of each batch: from ``references`` where a pipeline shares them, else computed."""
    if references is not None:
        return [references.outputs(batch) for batch in batches]
    with dequantized(graph):
        return [executor.forward(batch) for batch in batches]


def check_data(graph: Graph, executor: NumpyExecutor, dataloader: Iterable | None, samples: int,
               collate_fn: Callable | None, pass_arguments: dict, description: str) -> tuple[list, list] | None:
    """What a checked pass measures its change on: the first ``samples`` held-aside samples (the calibration
    data where the pipeline holds none aside) and their FP32 outputs, taken now, before the pass changes a
    float value; None where there is no sample to measure."""
    batches = held_aside_or_calibration(pass_arguments.get("held_aside"), dataloader, samples, collate_fn,
                                        description)
    if not batches:
        return None
    return batches, references_of(batches, graph, executor, pass_arguments.get("references"))
