"""Revision numbers: what identifies the state of a mutable object at a moment, for caches keyed on it.

An object of a :class:`Revised` class takes the next number of one process-wide counter on every
assignment to one of its attributes (but those its class names as caches), and a fresh one when it is
copied or unpickled; numbers are never reused within a process.  So two equal numbers mean the same object
in the same state: a cache may keep what it derives from the object under them.  (Arrays it holds must be
replaced, not edited in place: a quantization config's are read-only.)
"""

from __future__ import annotations

import itertools

_NUMBERS = itertools.count(1)


class Revised:
    """Mixin: ``_revision``, the number of the last assignment (see the module)."""

    _CACHES: frozenset = frozenset({"_revision"})   # attributes whose assignment changes nothing it computes

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        if name not in self._CACHES:
            object.__setattr__(self, "_revision", next(_NUMBERS))

    def __getstate__(self) -> dict:   # copies and pickles (other processes) take a number of their own
        return {name: value for name, value in self.__dict__.items() if name not in self._CACHES}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_revision", next(_NUMBERS))
