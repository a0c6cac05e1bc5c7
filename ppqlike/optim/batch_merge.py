"""Calibration data handed over one sample (or a few) at a time, run as larger batches.

Users often calibrate with a list of single images.  The executor runs a batch of 16 images in far less than
16 times the time of one (every op's fixed cost is paid once, the kernels' threads have work to share), so
quantizing EfficientNet-Lite0 from 200 single images took twice as long as from the same images in batches of
16.  :func:`merge_small_batches` regroups such data into batches of up to ``MERGED_SAMPLES`` samples before the
pipeline reads it.

Only where that cannot change what the model computes for a sample: all of the data is used, and it is in memory
(a list or tuple) or read again on each pass from a sized source that declares a small ``batch_size`` (a torch
DataLoader with ``batch_size=1``; read once into memory here, up to ``MATERIALIZED_BYTES``; ppqlike's own
``CalibrationFolder`` keeps its files for Ray's workers, and a source that declares no batch size is not read
ahead to find it); every batch holds the same number of samples, the same inputs, dtypes and per-sample shapes;
every model input declares its first axis as the same symbolic size and its other axes as fixed sizes (a
``[sequence, batch, features]`` input, or a fixed batch of 1, is left alone); and, run in float, two batches
merged give the outputs the two give apart (a Reshape that hard-codes a batch of 1 does not).  The batches held
aside for the verdict and the protection are merged apart from the others (how many are held is decided on the
data as given), and nothing is merged where none are held (too few batches to gain).  The Ray backend shares
the merged batches among its workers, so its results stay the local run's.

Reads: the graph's inputs, the executor (two float forward passes) and the data (once).  Writes nothing; returns a
new list.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..core.ir import Graph
from ..executor import NumpyExecutor
from ..executor.simulation import dequantized

__all__ = ["MERGED_SAMPLES", "MERGED_BYTES", "MATERIALIZED_BYTES", "merge_small_batches"]

#: samples in a merged batch, at most (the batch the shared CNNs' benchmarks use)
MERGED_SAMPLES = 16
#: input bytes of a merged batch, at most (large inputs gain little from batching and cost memory)
MERGED_BYTES = 16 << 20
#: input bytes of all the data, at most, where it is read into memory from a sized source (not a list or tuple)
MATERIALIZED_BYTES = 256 << 20
#: how close the merged batch's float outputs must be to the samples' own, relative to their largest value
AGREEMENT = 1e-4


def batch_axis_is_free(graph: Graph) -> bool:
    """Whether every input of ``graph`` declares axis 0 as one shared symbolic size and its other axes fixed."""
    symbols = set()
    for value in graph.inputs:
        shape = value.shape
        if not shape or isinstance(shape[0], int) and shape[0] > 0:
            return False
        if not all(isinstance(size, int) and size > 0 for size in shape[1:]):
            return False
        symbols.add(shape[0])
    return len(symbols) == 1


def _layout(batch: dict) -> tuple | None:
    """(samples, ((name, dtype, per-sample shape), ...)) of a batch; None where the inputs disagree on axis 0."""
    counts = {array.shape[0] if array.ndim else None for array in batch.values()}
    if len(counts) != 1 or None in counts:
        return None
    return counts.pop(), tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(batch.items()))


def _concatenated(batches: list[dict]) -> dict:
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


def _merging_keeps_outputs(executor: NumpyExecutor, graph: Graph, batches: list[dict]) -> bool:
    """Whether ``batches`` run as one batch give, in float, each one's own outputs stacked."""
    with dequantized(graph):
        try:
            merged = executor.forward(_concatenated(batches))
            apart = [executor.forward(batch) for batch in batches]
        except Exception:   # noqa: BLE001 - (a Reshape to [1, 256] refuses a batch of 2; calibration reports
            return False    # what is wrong with the batches as given)
    for index, output in enumerate(merged):
        parts = [np.asarray(outputs[index]) for outputs in apart]
        output = np.asarray(output)
        if any(part.ndim == 0 for part in parts) or len({part.shape[1:] for part in parts}) != 1:
            return False   # (no batch axis, or a data-dependent shape: NonZero, detections)
        stacked = np.concatenate(parts)
        if output.shape != stacked.shape:
            return False
        if np.issubdtype(stacked.dtype, np.floating):
            scale = float(np.max(np.abs(stacked), initial=0.0))
            if not np.allclose(output, stacked, rtol=AGREEMENT, atol=AGREEMENT * max(scale, 1e-30)):
                return False
        elif not np.array_equal(output, stacked):
            return False
    return True


def merge_small_batches(graph: Graph, executor: NumpyExecutor, dataloader, batches: Iterable[dict],
                        calib_steps: int | None, held: int) -> tuple[list[dict], dict] | None:
    """(the batches regrouped into batches of up to MERGED_SAMPLES samples, the first ones and the ``held`` last
    ones, held aside, apart; what was done) where the module docstring's conditions hold; None where
    the data stays as it is.  ``dataloader``: the user's data (merged only when it is a list or tuple and
    ``calib_steps`` is None, or a sized source read again on each pass: :func:`_read_whole_again`); ``batches``:
    the same, checked (dicts)."""
    if calib_steps is not None or not _read_whole_again(dataloader) or len(dataloader) - held < 2:
        return None
    if not batch_axis_is_free(graph):
        return None
    batches = list(batches) if isinstance(dataloader, (list, tuple)) else _read_into_memory(batches,
                                                                                             len(dataloader))
    layouts = {_layout(batch) for batch in batches or ()}
    if len(layouts) != 1 or None in layouts:
        return None
    samples = layouts.pop()[0]
    per_group = _batches_per_group(batches[0])
    if per_group < 2 or not _merging_keeps_outputs(executor, graph, batches[:2]):
        return None
    calibration, held_aside = batches[:len(batches) - held], batches[len(batches) - held:]
    merged, kept = _grouped(calibration, per_group), _grouped(held_aside, per_group)
    return merged + kept, {"batches": len(calibration), "merged_into": len(merged),
                           "samples_per_batch": samples * per_group, "held_aside": len(held_aside),
                           "held_aside_merged_into": len(kept)}


def _read_whole_again(dataloader) -> bool:
    """Whether ``dataloader`` is a list or tuple, or a sized source that gives all of its batches again on each
    pass and declares a ``batch_size`` small enough to merge (a torch DataLoader; not an iterator, which gives
    them once; not a CalibrationFolder, which shards its files on Ray)."""
    if isinstance(dataloader, (list, tuple)):
        return True
    if hasattr(dataloader, "__next__") or hasattr(dataloader, "calibration_shard"):
        return False
    declared = getattr(dataloader, "batch_size", None)   # a DataLoader's (without it, the source is not read
    if not isinstance(declared, int) or isinstance(declared, bool) or not 0 < declared <= MERGED_SAMPLES // 2:
        return False                                      # ahead: a lazy loader is read once)
    try:
        return len(dataloader) > 0
    except TypeError:
        return False


def _batches_per_group(batch: dict) -> int:
    """How many batches like ``batch`` a merged batch holds: MERGED_SAMPLES samples and MERGED_BYTES at most."""
    samples = max(next(iter(batch.values())).shape[0], 1)
    sample_bytes = sum(array.nbytes for array in batch.values()) // samples
    return min(MERGED_SAMPLES, MERGED_BYTES // max(sample_bytes, 1)) // samples


def _read_into_memory(batches: Iterable[dict], count: int) -> list[dict] | None:
    """The ``count`` batches in a list; None where the first batch shows they would not be merged (too many
    samples or bytes) or hold more than MATERIALIZED_BYTES of input (judged from the first, and checked as
    they are read), or the source gives another number of them."""
    kept, size = [], 0
    for batch in batches:
        if not kept and (_layout(batch) is None or _batches_per_group(batch) < 2):
            return None
        size += sum(array.nbytes for array in batch.values())
        if size > MATERIALIZED_BYTES or (not kept and size * count > MATERIALIZED_BYTES):
            return None
        kept.append(batch)
    return kept if len(kept) == count else None


def _grouped(batches: list[dict], per_group: int) -> list[dict]:
    """``batches`` concatenated ``per_group`` at a time, the short group first (the others are whole)."""
    first = len(batches) % per_group or per_group
    bounds = [0, *range(first, len(batches) + 1, per_group)] if batches else [0]
    return [_concatenated(batches[start:stop]) for start, stop in zip(bounds, bounds[1:])]
