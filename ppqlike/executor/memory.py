"""Freed memory kept in the process between forwards, as onnxruntime's arena keeps it.

A forward frees its activations as it goes.  With glibc's defaults the top of
the heap then goes back to the OS whenever more than a (self-adjusting) trim
threshold of it is free, and the next batch takes the same memory back page
by page: the kernel clears every page again (numpy asks for 2 MiB pages on
arrays of 4 MiB and more).  Measured on MobileNetV2, batch 16, 2 kernel
threads: about 2,900 page faults and 15-30 ms of kernel time a forward;
150 -> 136 ms a batch without them.

``keep_freed_memory()`` raises glibc's thresholds once per process (``mallopt``):
freed memory up to ``TRIM_THRESHOLD`` stays at the top of the heap for the
next allocation, and arrays below ``MMAP_THRESHOLD`` come from the heap
instead of a fresh mapping of their own.  The process's peak memory is what
it was; between forwards it holds on to that peak instead of returning and
re-faulting it.  Elsewhere than glibc it does nothing; set
``PPQLIKE_KEEP_FREED_MEMORY=0`` to leave the allocator as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

TRIM_THRESHOLD = 1 << 30    # bytes of free heap top kept instead of returned to the OS
MMAP_THRESHOLD = 256 << 20  # allocations from this size get a mapping of their own (freed at once)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters
_DECIDED: bool | None = None   # set, or left alone, for this process
_LOCK = threading.Lock()


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds (once per process); True when they are set (now or before)."""
    global _DECIDED
    with _LOCK:
        if _DECIDED is None:
            _DECIDED = _set_thresholds()
        return _DECIDED


def _set_thresholds() -> bool:
    if os.environ.get("PPQLIKE_KEEP_FREED_MEMORY", "1").strip() == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # both together: setting either one alone turns off glibc's self-adjusting mmap threshold.  Some glibc
    # versions refuse an mmap threshold above half their heap size (32 MiB on 64-bit machines): then that.
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or mallopt(_M_MMAP_THRESHOLD, 32 << 20)):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
