"""A range of a calibration dataloader's batches, read in one pass and partly kept (``quantize_onnx_model``'s
calibration batches and the held-aside ones after them)."""

from __future__ import annotations

import itertools
from typing import Iterable

from .passes.sensitivity import sample_count


class BatchRange:
    """Batches ``start`` to ``stop`` (exclusive) of a re-iterable dataloader.

    A range that ``keep``s its batches holds them once read (the held-aside batches: a few, measured on by the
    observer choice, the protection and the verdict).  A range with a ``tail`` (the range right after it) reads
    the tail's batches into it when its own reading ends, from the same pass over the data: a lazy loader
    (JPEGs decoded per batch) is read once, not once more per reader of the held-aside batches.  A range not at
    the start of data that reads its own shards (a CalibrationFolder) reads just its batches.  A range with
    ``head_samples`` holds its first batches up to that many samples once read (what bias correction measures
    on after calibration has read them), and hands them to the next reader from memory."""

    def __init__(self, dataloader: Iterable, start: int, stop: int, keep: bool = False,
                 tail: "BatchRange | None" = None, head_samples: int = 0):
        self.dataloader, self.start, self.stop = dataloader, start, stop
        self.keep, self.tail, self.head_samples = keep, tail, head_samples
        self.kept: list | None = None
        self.head: list | None = None

    def __len__(self):
        return self.stop - self.start

    def __iter__(self):
        if self.kept is not None:
            return iter(self.kept)
        return self._from_head() if self.head is not None else self._read()

    def _from_head(self):
        yield from self.head
        if len(self.head) < len(self):   # a reader going further: the rest read again
            yield from itertools.islice(self._read(), len(self.head), None)

    def _read(self):
        shard = self.calibration_shard(0, len(self)) if self.start else None
        if shard is not None:   # the data reads its own range (a folder: those files alone)
            batches = iter(shard)
        else:
            batches = iter(self.dataloader)
            for _ in itertools.islice(batches, self.start):
                pass
        kept, head, head_count = [], [], 0
        for index, batch in enumerate(itertools.islice(batches, len(self))):
            if self.keep:
                kept.append(batch)
            if self.head is None and head_count < self.head_samples:
                head.append(batch)
                head_count += sample_count(batch)
                if head_count >= self.head_samples or index == len(self) - 1:
                    self.head = head
            if index == len(self) - 1:   # before the last is handed over: a reader may stop after it
                self._read_tail(batches)
            yield batch
        if self.keep and len(kept) == len(self):
            self.kept = kept

    def _read_tail(self, batches) -> None:
        tail = self.tail   # (a keeping range that starts where this one stops: _hold_aside makes it so)
        if tail is not None and tail.kept is None:
            after = list(itertools.islice(batches, len(tail)))
            if len(after) == len(tail):
                tail.kept = after

    def calibration_shard(self, start: int, stop: int):
        """Batches ``start`` to ``stop`` of this range, read by the dataloader's shard reader (None: none)."""
        shard = getattr(self.dataloader, "calibration_shard", None)
        return None if shard is None else shard(self.start + start, min(self.start + stop, self.stop))
