"""PPQ compatibility notes: torch-only words a PPQ script passes are accepted and said once, quietly.

``note_once(message)`` issues a :class:`PPQCompatibilityWarning` the first time a message is seen in
this process; ``ignore_device(device, where)`` notes a CUDA device that the numpy executor does not use.
"""

from __future__ import annotations

import warnings

_SAID: set[str] = set()


class PPQCompatibilityWarning(UserWarning):
    """A PPQ-only word was accepted and does nothing here (shown once per message)."""


def note_once(message: str, stacklevel: int = 3) -> None:
    """Warn ``message`` (PPQCompatibilityWarning) the first time it is given."""
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, PPQCompatibilityWarning, stacklevel=stacklevel)


def ignore_device(device, where: str) -> None:
    """Note once that ``device`` (PPQ's 'cuda', 'cuda:0', ...) is ignored: ppqlike computes with numpy on the CPU."""
    if device is not None and str(device).lower() != "cpu":
        note_once(f"{where}: device={device!r} is ignored; ppqlike computes with numpy on the CPU")


def tolerant_collate(collate_fn):
    """``collate_fn`` wrapped so that PPQ's device moves (``lambda x: x.to('cuda')``, ``x.cuda()``) on numpy
    batches are skipped with a note instead of failing; None stays None."""
    if collate_fn is None:
        return None

    def collate(batch):
        try:
            return collate_fn(batch)
        except AttributeError as error:
            if any(word in str(error) for word in ("'to'", "'cuda'", "'cpu'")):
                note_once("collate_fn moves batches to a torch device; ppqlike's numpy batches stay where they "
                          "are (collate_fn skipped)")
                return batch
            raise
    return collate
