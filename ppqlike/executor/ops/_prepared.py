"""Prepared forms of constant parameters, made once and kept while the parameters live.

Some kernels lay a weight out anew on every call: a 1x1 convolution's GEMM
matrix (transposed, the bias as an extra row), a depthwise convolution's
per-column tap weights, an integer kernel's weight and bias codes.  On a
forward that is milliseconds of serial work (MobileNetV2, batch 16: about
5 ms in 150 in FP32, 18 ms more for onnxruntime's integer kernels), repeated
for every batch although the weights do not change.

``prepared(make, key, arrays)`` returns ``make()``, computed once for the
``key`` and the very ``arrays`` objects and then reused while they all live
(weak references: the entry goes when one of them is collected; past
``MAX_ENTRIES`` entries the oldest go).  Only read-only arrays whose memory
nothing writeable owns are taken as constant (a graph's parameters are so:
loaded read-only from the model's bytes; so are baked values); a writeable
array, or a read-only view of writeable memory, may change in place and is
never cached.  Results are shared: arrays among them are made read-only.
"""

from __future__ import annotations

import weakref
from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")

_ENTRIES: dict[tuple, tuple[tuple, object]] = {}
MAX_ENTRIES = 4096   # past this many, the oldest entry goes (inputs of ever new shapes, grids tried by a search)


def is_constant(value: np.ndarray | None) -> bool:
    """Whether ``value`` cannot change in place: read-only, and so is every array its memory comes from
    (None counts as constant)."""
    while isinstance(value, np.ndarray):
        if value.flags.writeable:
            return False
        value = value.base
    return value is None or isinstance(value, bytes)


def prepared(make: Callable[[], T], key: tuple | Callable[[], tuple], arrays: tuple) -> T:
    """``make()``, cached for ``key`` and the identities of ``arrays`` (ndarrays or None) while they live;
    computed afresh (and not kept) when one of them could change in place.  ``key`` may be a function
    giving it, called only then (a key read from a config's scale costs more than a plain call)."""
    if not all(is_constant(array) for array in arrays):
        return make()
    full_key = (key() if callable(key) else key) + tuple(id(array) for array in arrays)
    entry = _ENTRIES.get(full_key)
    if entry is not None and all(ref is None if array is None else ref() is array
                                 for ref, array in zip(entry[0], arrays)):
        return entry[1]
    result = _read_only(make())

    def forget(_, full_key=full_key, entries=_ENTRIES):   # (the module's globals may be gone at exit)
        entries.pop(full_key, None)   # no lock: a collection inside a locked section would call this and wait

    references = tuple(None if array is None else weakref.ref(array, forget) for array in arrays)
    _ENTRIES[full_key] = (references, result)   # single dict operations are atomic: threads need no lock
    while len(_ENTRIES) > MAX_ENTRIES:
        try:
            _ENTRIES.pop(next(iter(_ENTRIES)), None)
        except (StopIteration, RuntimeError):   # emptied, or changed by another thread meanwhile
            break
    return result


def _read_only(result):
    """``result`` with its arrays (itself, or the members of a tuple) made read-only: a kept result is shared."""
    for array in result if isinstance(result, tuple) else (result,):
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return result
