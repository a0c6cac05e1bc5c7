"""The PPQ names a PPQ script imports with ``from ppq import *`` / ``from ppq.api import *``, over ppqlike's own.

``BaseGraph`` is ppqlike's Graph, ``TorchExecutor`` the numpy executor (taking PPQ's ``device``),
``ENABLE_CUDA_KERNEL`` a context that changes nothing, ``ppq_warning`` a warning, ``PPQ_CONFIG`` says there
is no CUDA kernel, ``convert_any_to_numpy`` turns a tensor-like into an array.  Torch-only words are accepted
and noted once (``ppqlike.core.compat``).  See docs/MIGRATING_FROM_PPQ.md.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from . import __version__
from .core.compat import ignore_device, note_once
from .core.declared_names import DeclaredAttributes
from .core.ir import Graph
from .executor import NumpyExecutor

BaseGraph = Graph


class _PPQConfiguration(DeclaredAttributes):
    """PPQ's global configuration object, with PPQ's names (they change nothing here; a misspelled one is
    refused)."""

    def __init__(self):
        self.USING_CUDA_KERNEL, self.NAME, self.VERSION = False, "ppqlike", __version__
        self.DUMP_VALUE_WHEN_EXPORT, self.EXPORT_PPQ_INTERNAL_INFO, self.PPQ_DEBUG = True, False, False

    def _declared_attributes(self):
        return ("USING_CUDA_KERNEL", "NAME", "VERSION", "DUMP_VALUE_WHEN_EXPORT", "EXPORT_PPQ_INTERNAL_INFO",
                "PPQ_DEBUG")

    def _attribute_owner(self) -> str:
        return "PPQ_CONFIG"

    def __repr__(self) -> str:
        return f"PPQ_CONFIG({vars(self)})"


PPQ_CONFIG = _PPQConfiguration()


class TorchExecutor(NumpyExecutor):
    """PPQ's executor name: ppqlike's numpy executor; ``device`` is accepted and noted once."""

    def __init__(self, graph: Graph, device: str | None = None, runtime_kernels: bool = True):
        ignore_device(device, "TorchExecutor")
        super().__init__(graph, runtime_kernels=runtime_kernels)


class ENABLE_CUDA_KERNEL:  # noqa: N801 - PPQ's name
    """PPQ's ``with ENABLE_CUDA_KERNEL():`` block: nothing to enable, ppqlike computes with numpy."""

    def __enter__(self):
        note_once("ENABLE_CUDA_KERNEL: ppqlike has no CUDA kernels; the block runs with numpy on the CPU")
        return self

    def __exit__(self, *exc_info) -> bool:
        return False


def ppq_warning(message: str) -> None:
    """PPQ's warning printer: a UserWarning."""
    warnings.warn(str(message), UserWarning, stacklevel=2)


def convert_any_to_numpy(value: Any) -> np.ndarray:
    """An array from an array, a scalar, a list or a tensor-like with ``.detach().cpu().numpy()``/``.numpy()``."""
    for method in ("detach", "cpu"):
        if hasattr(value, method) and not isinstance(value, np.ndarray):
            value = getattr(value, method)()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


__all__ = ["BaseGraph", "ENABLE_CUDA_KERNEL", "PPQ_CONFIG", "TorchExecutor", "convert_any_to_numpy", "ppq_warning"]
