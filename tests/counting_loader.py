"""A dataloader for tests that count how often calibration data is read."""

from __future__ import annotations


class CountingLoader:
    """A sized, re-iterable dataloader (as torch's DataLoader, or a loader decoding JPEGs on demand, is) that
    counts the batches drawn from it (``made``)."""

    def __init__(self, batches):
        self.batches, self.made = batches, 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            self.made += 1
            yield batch
