"""Hooks around the executor's ops, and what the bodies of If/Loop/Scan take up from the forward running them.

:class:`OperationHook` is what the passes subclass (calibration, bias correction...); :func:`running` is
entered by :class:`~ppqlike.executor.NumpyExecutor` around each forward: a body run inside it is run by the
same kind of executor, with the same runtime-kernel choice, and seen by the hooks that reach bodies.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

from ..core.ir import Operation
from .ops.control_flow import RUNNING


class OperationHook:
    """Called around every op.  Subclass and override what you need.

    ``before_operation`` sees the op's input arrays (after input quantization)
    and ``after_operation`` its output arrays (after output quantization).
    Returning a list replaces the values; returning None keeps them.
    """

    def before_operation(self, operation: Operation, inputs: list) -> list | None:
        return None

    def after_operation(self, operation: Operation, inputs: list, outputs: list) -> list | None:
        return None

    def lets_fuse(self, producer: Operation, activation: Operation) -> bool:
        """Whether the executor may run ``producer`` (a Conv, Gemm, ...) and the Relu/Clip reading it as one
        kernel: the hook then sees neither the producer's outputs nor the activation's inputs (never made),
        and the activation's ``after_operation`` gets ``inputs=[]``.  False here: every value is seen."""
        return False

    #: True: the hook also sees the ops of the bodies of If/Loop/Scan (each time a body runs).
    reaches_bodies = False


@contextmanager
def running(executor, hooks: Sequence[OperationHook]):
    """While in the block, the bodies of If/Loop/Scan run as ``executor`` runs, seen by its hooks that reach
    bodies (``ops.control_flow.RUNNING``)."""
    reaching = tuple(hook for hook in hooks if getattr(hook, "reaches_bodies", False))
    token = RUNNING.set((reaching, executor.runtime_kernels, type(executor)))
    try:
        yield
    finally:
        RUNNING.reset(token)


def after_hooks(hooks, operation: Operation, arguments: list, results: list, names, grids: dict) -> list:
    """``results`` of ``operation`` (its outputs ``names``) as its hooks' ``after_operation`` leave them; a
    replaced value may lie anywhere, so the grids of those outputs are forgotten."""
    for hook in hooks:
        replaced = hook.after_operation(operation, arguments, results)
        if replaced is not None:
            results = list(replaced)
            for name in names:
                grids.pop(name, None)
    return results
