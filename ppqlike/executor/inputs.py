"""A forward's inputs: what the user passed, turned into the graph's named arrays (``NumpyExecutor.forward``)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..core.errors import ExecutionError
from ..core.ir import Graph


def named_inputs(graph: Graph, inputs: Any) -> dict[str, np.ndarray]:
    """Turn ``inputs`` (a mapping, a list in graph-input order, or one array) into ``graph``'s named arrays.

    Arrays are converted to each input's declared dtype; a missing input or
    a rank that differs from the declared one is an ExecutionError.
    """
    if isinstance(inputs, Mapping):
        named = dict(inputs)
    elif isinstance(inputs, np.ndarray) or np.isscalar(inputs):
        if len(graph.inputs) != 1:
            raise ExecutionError(
                f"graph {graph.name!r} has {len(graph.inputs)} inputs "
                f"({[v.name for v in graph.inputs]}); pass a dict of name -> array")
        named = {graph.inputs[0].name: inputs}
    else:
        arrays = list(inputs)
        if len(arrays) != len(graph.inputs):
            raise ExecutionError(f"graph {graph.name!r} expects {len(graph.inputs)} inputs, got {len(arrays)}")
        named = {v.name: a for v, a in zip(graph.inputs, arrays)}
    unknown = set(named) - {v.name for v in graph.inputs}
    if unknown:
        raise ExecutionError(f"graph {graph.name!r} has no input named {sorted(unknown)}; "
                             f"its inputs are {[v.name for v in graph.inputs]}")
    prepared = {}
    for variable in graph.inputs:
        if variable.name not in named:
            continue
        array = np.asarray(named[variable.name])
        if variable.dtype is not None and array.dtype != variable.dtype:
            array = array.astype(variable.dtype)
        if variable.shape is not None and array.ndim != len(variable.shape):
            raise ExecutionError(
                f"input {variable.name!r} of graph {graph.name!r} must have rank {len(variable.shape)} "
                f"(shape {variable.shape}), got an array of shape {list(array.shape)}")
        for declared, actual in zip(variable.shape or (), array.shape):
            if isinstance(declared, int) and declared > 0 and declared != actual:
                raise ExecutionError(
                    f"input {variable.name!r} of graph {graph.name!r} must have shape {variable.shape}, "
                    f"got {list(array.shape)}")
        prepared[variable.name] = array
    return prepared
