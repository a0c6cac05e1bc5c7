"""How much each part of a quantized graph costs the output: cosines against FP32, and runs with one unit alone.

The accuracy target (:mod:`.mixed_precision`) and the protection of sensitive layers (:mod:`.protection`)
measure with these.  :class:`AloneRunner` caches one batch's FP32 intermediates and re-runs only the ops
downstream of a unit with that unit quantized (everything else float): a unit costs a partial forward.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation
from ...core.op_facts import COMPUTING_TYPES
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from ..base import iterate_calibration

#: ops :meth:`AloneRunner.reader_error` runs past a unit at most, looking for the next computing ops
READER_REACH = 12
#: bytes of FP32 intermediates :class:`CachedSamples` holds at once (the ViT-S's 16 held-aside images hold
#: 8.6 GB of them, EfficientNet-Lite0's 16 about 0.3 GB)
CACHE_BUDGET_BYTES = 1 << 30


# ------------------------------------------------------------------ metrics
def output_parts(graph: Graph) -> list:
    """Per graph output, ``(axis, sizes)`` of the parts a Concat joined into it (sizes along its axis, from the
    inputs' static shapes), or None.  A detector's output concatenates boxes in pixels with class scores in
    [0, 1] (Ultralytics' [N, 4 + classes, anchors]): compared as one vector, the boxes' coordinates outweigh
    the scores ten-thousandfold and a range that clips every detection's score reads as closest to FP32."""
    parts = []
    for variable in graph.outputs:
        operation, entry = variable.producer, None
        if operation is not None and operation.type == "Concat" and len(operation.inputs) > 1:
            axis = int(operation.attributes.get("axis", 0))
            sizes = [None if part.shape is None or not -len(part.shape) <= axis < len(part.shape)
                     else part.shape[axis] for part in operation.inputs]
            if all(isinstance(size, (int, np.integer)) and size > 0 for size in sizes):
                entry = (axis, [int(size) for size in sizes])
        parts.append(entry)
    return parts


def _split(array: np.ndarray, part: tuple | None) -> list:
    """``array`` cut into its Concat parts (:func:`output_parts`), or [array] where it has none or they do not fit."""
    if part is None or array.ndim < 2:
        return [array]
    axis, sizes = part
    if not -array.ndim <= axis < array.ndim or sum(sizes) != array.shape[axis]:
        return [array]
    return np.split(array, np.cumsum(sizes)[:-1], axis=axis)


def _row_cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``got`` with the same row of ``want`` (2-D, float64); 1 where both are zero
    and equal, 0 where one norm is zero."""
    dot = np.sum(got * want, axis=1)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), np.where(np.all(got == want, axis=1), 1.0, 0.0))


def sample_cosines(outputs: list, references: list, parts: list | None = None) -> np.ndarray:
    """Per sample, the cosine between ``outputs`` and ``references`` averaged over the outputs ([N]; one value
    per output when the outputs disagree on the batch size).  ``parts`` (:func:`output_parts`): an output a
    Concat wrote counts as its parts, each compared over the whole batch (every sample given that value): a
    detector's scores are sparse, and the samples without a detection would measure only the noise on
    their background."""
    values = []
    for index, (got, want) in enumerate(zip(outputs, references)):
        part = parts[index] if parts is not None and index < len(parts) else None
        pieces = list(zip(_split(np.asarray(got), part), _split(np.asarray(want), part)))
        pooled = len(pieces) > 1   # (a split array has a batch axis: _split cuts only arrays of rank >= 2)
        for got_piece, want_piece in pieces:
            got_piece, want_piece = np.asarray(got_piece, np.float64), np.asarray(want_piece, np.float64)
            rows = got_piece.shape[0] if got_piece.ndim >= 2 and not pooled else 1
            cosines = _row_cosines(got_piece.reshape(rows, -1), want_piece.reshape(rows, -1))
            values.append(np.repeat(cosines, got_piece.shape[0]) if pooled else cosines)
    if not values:
        return np.ones(1)
    if len({len(v) for v in values}) == 1:
        return np.mean(values, axis=0)
    return np.array([float(np.mean(v)) for v in values])


def output_cosine(outputs: list, references: list, parts: list | None = None) -> float:
    """Mean over outputs (and their ``parts``) of the per-sample cosine between ``outputs`` and ``references``."""
    return float(np.mean(sample_cosines(outputs, references, parts)))


def output_error(executor: NumpyExecutor, batches: list, references: list) -> float:
    """1 - the mean per-sample output cosine of the graph as it runs now against ``references`` (outputs a
    Concat wrote, part by part); 1.0 where the outputs are not finite (as far from FP32 as it gets)."""
    parts = output_parts(executor.graph)
    value = float(1.0 - np.mean(np.concatenate([sample_cosines(executor.forward(batch), reference, parts)
                                                for batch, reference in zip(batches, references)])))
    return 1.0 if value != value else value


def cosine_lower_bound(values: np.ndarray) -> float:
    """mean - one standard error of the per-sample cosines: what the target is held to, so that a mean that
    clears it on a few dozen held-aside samples by less than their spread does not count as reached."""
    values = np.asarray(values, np.float64)
    if values.size < 2:
        return float(np.mean(values))
    return float(np.mean(values) - np.std(values, ddof=1) / np.sqrt(values.size))


def leading_samples(batch, samples: int):
    """The first ``samples`` samples of a batch (an array, a list of arrays or a dict of arrays, each with a
    leading batch axis); the batch as it is when its inputs do not share one (a scalar input such as a
    Loop's trip count, a state whose batch axis is not the first)."""
    if isinstance(batch, dict):
        arrays = {name: np.asarray(value) for name, value in batch.items()}
    elif isinstance(batch, (list, tuple)):
        arrays = dict(enumerate(np.asarray(value) for value in batch))
    else:
        return np.asarray(batch)[:samples] if np.ndim(batch) else np.asarray(batch)
    if not all(a.ndim for a in arrays.values()) or len({a.shape[0] for a in arrays.values()}) > 1:
        return batch
    limited = {name: value[:samples] for name, value in arrays.items()}
    return limited if isinstance(batch, dict) else list(limited.values())


def sample_slice(batch, start: int, stop: int):
    """Samples ``start`` to ``stop`` of a batch whose inputs share a leading axis (an array, a list of arrays
    or a dict of arrays)."""
    if isinstance(batch, dict):
        return {name: np.asarray(value)[start:stop] for name, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [np.asarray(value)[start:stop] for value in batch]
    return np.asarray(batch)[start:stop]


def sample_count(batch) -> int:
    """The samples in a batch: the leading axis its inputs share; 1 when they share none (the batch is one
    sample: a clip of a stateful model with its state inputs, a Loop's inputs)."""
    if isinstance(batch, dict):
        shapes = [np.shape(value) for value in batch.values()]
    elif isinstance(batch, (list, tuple)):
        shapes = [np.shape(value) for value in batch]
    else:
        shapes = [np.shape(batch)]
    if not shapes or not all(shapes) or len({shape[0] for shape in shapes}) > 1:
        return 1
    return int(shapes[0][0])


def measured_batches(source: Iterable, samples: int, collate_fn: Callable | None = None,
                     description: str = "measurement data") -> list:
    """The first batches of ``source`` holding ``samples`` samples (the last one cut to fit, where its inputs
    share a leading axis): what the protection and the verdict measure on, whatever the batch size."""
    batches, count = [], 0
    for batch in iterate_calibration(source, None, collate_fn, description, False):
        batch = leading_samples(batch, samples - count)
        batches.append(batch)
        count += sample_count(batch)
        if count >= samples:
            break
    return batches


def held_aside_or_calibration(held_aside: Iterable | None, dataloader: Iterable, samples: int,
                              collate_fn: Callable | None = None, description: str = "measurement data") -> list:
    """The first ``samples`` samples of the held-aside batches, or of the calibration data where the pipeline
    holds none aside: what the protection and the bias correction's check measure on."""
    return measured_batches(held_aside if held_aside is not None else dataloader, samples, collate_fn, description)


def topped_up(batches: list, held_aside: Iterable | None, dataloader: Iterable, minimum: int,
              calib_steps: int | None = None, collate_fn: Callable | None = None,
              description: str = "measurement data") -> list:
    """``batches`` (measured on the held-aside samples) with the last calibration samples added until they hold
    ``minimum`` samples: where only 2 are held aside (8 images, a quarter of them), one image decides what the
    measure says.  As they are where they hold enough, or where nothing is held aside (they are calibration
    samples already)."""
    count = sum(sample_count(batch) for batch in batches)
    if held_aside is None or count >= minimum:
        return batches
    # (the last batches only are held: every batch holds a sample at least)
    last = collections.deque(iterate_calibration(dataloader, calib_steps, collate_fn, description, False),
                             maxlen=minimum)
    extra = []
    for batch in reversed(last):
        if count >= minimum:
            break
        extra.append(leading_samples(batch, minimum - count))
        count += sample_count(extra[-1])
    return batches + extra[::-1]


# ---------------------------------------------------------------- running
class AloneRunner:
    """FP32 intermediates of one batch, and partial re-runs with one unit quantized."""

    def __init__(self, graph: Graph, executor: NumpyExecutor):
        self.graph, self.executor = graph, executor
        self.order = graph.topological_sort()
        self.index = {op.name: i for i, op in enumerate(self.order)}
        self.outputs = [v.name for v in graph.outputs]
        self.downstream: dict[str, list[Operation]] = {}
        self.observed: dict[str, tuple[float, float]] = {}  # tensor -> FP32 (min, max) over cached batches

    def cache(self, batch) -> dict:
        names = [v.name for op in self.order for v in op.outputs]
        with dequantized(self.graph):
            values = self.executor.forward(batch, output_names=names)
        cached = dict(zip(names, values))
        cached.update(self.executor.prepare_inputs(batch))
        for name, value in cached.items():
            value = np.asarray(value)
            if value.size and value.dtype.kind == "f":
                low, high = float(value.min()), float(value.max())
                seen = self.observed.get(name, (low, high))
                self.observed[name] = (min(seen[0], low), max(seen[1], high))
        return cached

    def _plan(self, unit: list[Operation]) -> list[Operation]:
        key = "|".join(op.name for op in unit)
        if key not in self.downstream:
            reached = set()
            for operation in unit:
                reached.add(operation.name)
                reached |= {op.name for op in self.graph.descendants(operation)}
            self.downstream[key] = sorted((self.graph.operations[n] for n in reached),
                                          key=lambda op: self.index[op.name])
        return self.downstream[key]

    def _arguments(self, operation: Operation, values: dict, cached: dict) -> list:
        variables = self.graph.variables
        return [None if variable is None else values[variable.name] if variable.name in values
                else cached[variable.name] if variable.name in cached else variables[variable.name].value
                for variable in operation.inputs]

    def quantize_alone(self, unit: list[Operation], cached: dict) -> list[np.ndarray]:
        """Graph outputs with only ``unit`` quantized (FP32 values elsewhere, recomputed downstream)."""
        members = {op.name for op in unit}
        values: dict = {}
        for operation in self._plan(unit):
            results = self.executor.run_operation(operation, self._arguments(operation, values, cached),
                                                  quantized=operation.name in members)
            for variable, value in zip(operation.outputs, results):
                values[variable.name] = value
        return [values[n] if n in values else cached[n] for n in self.outputs]

    def _run_unit(self, unit: list[Operation], cached: dict) -> dict:
        """The unit's ops run quantized on FP32 inputs: their results by name."""
        values: dict = {}
        for operation in unit:
            results = self.executor.run_operation(operation, self._arguments(operation, values, cached))
            for variable, value in zip(operation.outputs, results):
                values[variable.name] = value
        return values

    def reader_error(self, unit: list[Operation], cached: dict) -> float:
        """How much ``unit``'s quantization changes what the next layers compute: the unit's ops run quantized
        on FP32 inputs, the ops after it run in float on their results (other inputs FP32), in order, until
        each path reaches a computing op (Conv, Gemm, MatMul: COMPUTING_TYPES) or a graph output, at most
        READER_REACH ops; at those results (and, where the reach ends first, at the last ones run) the
        relative squared error over the whole tensor, sum((value - reference)^2) / sum(reference^2), the
        largest.  The weights of the computing op say which channels matter: a channel a few steps of a
        per-tensor grid wide that a depthwise conv multiplies by 40 (PicoDet's backbone, behind a HardSwish
        written as four ops) counts, a dead channel of a Concat does not.  A ranking beside
        :meth:`local_error`."""
        return self._reader_error(unit, cached, self._run_unit(unit, cached))

    def unit_errors(self, unit: list[Operation], cached: dict) -> tuple[float, float]:
        """(:meth:`local_error`, :meth:`reader_error`) from one run of the unit's ops."""
        values = self._run_unit(unit, cached)
        return self._local_error(unit, cached, values), self._reader_error(unit, cached, values)

    def _reader_error(self, unit: list[Operation], cached: dict, values: dict) -> float:
        members = {op.name for op in unit}
        outputs = set(self.outputs)
        pending = {reader.name: reader for op in unit for variable in op.outputs for reader in variable.consumers
                   if reader.name not in members}
        measured = [variable.name for op in unit for variable in op.outputs if variable.name in outputs]
        run = 0
        while pending and run < READER_REACH:
            operation = pending.pop(min(pending, key=self.index.__getitem__))
            results = self.executor.run_operation(operation, self._arguments(operation, values, cached),
                                                  quantized=False)
            run += 1
            for variable, value in zip(operation.outputs, results):
                values[variable.name] = value
                if operation.type in COMPUTING_TYPES or variable.name in outputs:
                    measured.append(variable.name)
                else:
                    pending.update((reader.name, reader) for reader in variable.consumers)
        measured += [variable.name for op in pending.values() for variable in op.inputs
                     if variable is not None and variable.name in values]
        return max((tensor_relative_error(values[name], cached[name]) for name in dict.fromkeys(measured)
                    if name in cached), default=0.0)

    def local_error(self, unit: list[Operation], cached: dict) -> float:
        """How badly ``unit`` alone quantizes its own results, read where they leave it: the unit's ops run
        quantized on FP32 inputs, and at each result another op (or the graph's output) reads, the relative
        squared error per channel (axis 1 of a 4-D or 2-D tensor, the last axis of a 3-D one: per token
        features), averaged over channels; the largest of the results.  One op run per op: a cheap ranking
        of which units to measure with :meth:`quantize_alone` (a channel far narrower than the others loses
        its few steps to a per-tensor grid, which the mean over channels sees and a tensor-wide SNR hides)."""
        return self._local_error(unit, cached, self._run_unit(unit, cached))

    def _local_error(self, unit: list[Operation], cached: dict, values: dict) -> float:
        members = {op.name for op in unit}
        worst = 0.0
        outputs = set(self.outputs)
        for operation in unit:
            for variable in operation.outputs:
                value = values[variable.name]
                leaves = variable.name in outputs or any(c.name not in members for c in variable.consumers)
                reference = cached.get(variable.name)
                if leaves and reference is not None and np.asarray(reference).dtype.kind == "f":
                    worst = max(worst, channel_relative_error(np.asarray(value), np.asarray(reference)))
        return worst


class CachedSamples:
    """The measured batches' FP32 intermediates (:meth:`AloneRunner.cache`) with their references, visited
    piece by piece: ``for cached, reference in samples``, each visit in the same order.

    Where every batch's intermediates fit in ``budget`` bytes (``CACHE_BUDGET_BYTES``; measured on one
    sample first), each piece is a whole batch, cached once and held.  Where they do not, each batch is cut
    into pieces of as many samples as fit, cached again at each visit and let go, so that no more than the
    budget is held, for one more FP32 forward per visit (a ViT-S on TensorRT's placement held 8.6 GB for its 16 held-aside images).  A batch
    whose inputs or outputs share no leading axis stays whole."""

    def __init__(self, runner: AloneRunner, batches: list, references: list, budget: int | None = None):
        self.runner, budget = runner, CACHE_BUDGET_BYTES if budget is None else budget
        counts = [sample_count(batch) for batch in batches]
        per_sample = _cached_bytes(runner.cache(leading_samples(batches[0], 1))) if batches else 0
        if per_sample * sum(counts) <= budget:
            self.pieces = list(zip(batches, references))
            self.held = [runner.cache(batch) for batch in batches]
            return
        size, self.pieces, self.held = max(1, budget // max(per_sample, 1)), [], None
        for batch, reference, count in zip(batches, references, counts):
            splittable = count > 1 and all(np.ndim(value) and np.shape(value)[0] == count for value in reference)
            for start in range(0, count, size) if splittable else ():
                stop = min(start + size, count)
                self.pieces.append((sample_slice(batch, start, stop),
                                    [np.asarray(value)[start:stop] for value in reference]))
            if not splittable:
                self.pieces.append((batch, reference))

    def __len__(self) -> int:
        return len(self.pieces)

    def __iter__(self):
        for index, (piece, reference) in enumerate(self.pieces):
            yield (self.held[index] if self.held is not None else self.runner.cache(piece)), reference


def _cached_bytes(cached: dict) -> int:
    return int(sum(np.asarray(value).nbytes for value in cached.values()))


def tensor_relative_error(value, reference) -> float:
    """sum((value - reference)^2) / sum(reference^2) over the whole tensor, at most 1 (1 where the reference is
    zero and the value is not, or where it is not finite); 0 where the tensor is not a float one of the same
    shape."""
    value, reference = np.asarray(value), np.asarray(reference)
    if reference.dtype.kind != "f" or reference.size == 0 or value.shape != reference.shape:
        return 0.0
    difference = np.subtract(value, reference, dtype=np.result_type(value.dtype, reference.dtype, np.float32))
    error = float(np.vdot(difference.reshape(-1), difference.reshape(-1)))
    power = float(np.square(reference, dtype=difference.dtype).sum(dtype=np.float64))
    ratio = error / power if power > 0 else (1.0 if error > 0 else 0.0)
    return min(ratio, 1.0) if ratio == ratio else 1.0


def channel_relative_error(value: np.ndarray, reference: np.ndarray) -> float:
    """Mean over channels of sum((value - reference)^2) / sum(reference^2) per channel (see
    :meth:`AloneRunner.local_error` for the channel axis); a channel of zeros counts when it is not matched."""
    if reference.ndim == 0 or reference.size == 0 or value.shape != reference.shape:
        return 0.0
    axis = reference.ndim - 1 if reference.ndim == 3 else (1 if reference.ndim >= 2 else 0)
    other = tuple(i for i in range(reference.ndim) if i != axis)
    dtype = np.result_type(value.dtype, reference.dtype, np.float32)   # elementwise in the values' precision,
    difference = np.subtract(value, reference, dtype=dtype)            # sums in float64: no full-size float64
    np.square(difference, out=difference)                              # copies (a ranking, not a result)
    difference = difference.sum(axis=other, dtype=np.float64)
    power = np.square(reference, dtype=dtype).sum(axis=other, dtype=np.float64)
    ratio = np.where(power > 0, difference / np.where(power > 0, power, 1.0), np.where(difference > 0, 1.0, 0.0))
    ratio = np.where(np.isfinite(ratio), ratio, 1.0)
    return float(np.mean(np.minimum(ratio, 1.0)))
