"""Running a graph op by op, in float and quantized side by side, without touching any config state.

The analysis never switches configs: it runs each op through
``NumpyExecutor.run_operation(op, inputs, quantized=...)``.  ``quantized=False``
skips every config of the op, which is exactly what the op computes inside
``dequantized(graph)`` (there every applied or baked config is DEQUANTIZED,
and the other states pass values through anyway), so a float stream here is
the IR in float and the states need no restoring, even when a kernel raises.

The order and the moments at which intermediates can be dropped come from the
executor's compiled plan (``executor.compile().steps``), so memory stays that
of one forward per stream.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ..core.errors import ExecutionError, PPQLikeError
from ..core.ir import Graph, Operation
from ..core.quant_graph import quantizing_operations
from ..executor import NumpyExecutor


def select_operations(graph: Graph, operations: Iterable | None) -> list[Operation]:
    """The quantized ops to analyse: all of them, or those named in ``operations`` (KeyError names unknown ones)."""
    available = quantizing_operations(graph)
    if operations is None:
        return available
    wanted = {op if isinstance(op, str) else op.name for op in operations}
    unknown = sorted(wanted - set(graph.operations))
    if unknown:
        raise KeyError(f"graph {graph.name!r} has no operation named {unknown}")
    return [op for op in available if op.name in wanted]


def float_outputs(outputs: list) -> list[int]:
    """Indices of the floating-point arrays among ``outputs``."""
    return [i for i, value in enumerate(outputs)
            if value is not None and np.issubdtype(np.asarray(value).dtype, np.floating)]


def prepare_inputs(executor: NumpyExecutor, plan, batch) -> dict:
    """The batch as named, checked arrays (``NumpyExecutor.prepare_inputs``); every input the plan needs given."""
    inputs = executor.prepare_inputs(batch)
    for name in plan.needed_inputs:
        if name not in inputs:
            raise ExecutionError(f"graph {executor.graph.name!r}: input {name!r} was not given")
    return inputs


def run_step(executor: NumpyExecutor, step, values: dict, quantized: bool) -> list:
    """Run one plan step on ``values`` (name -> array), store its outputs there, drop what it releases."""
    operation = step.operation
    variables = executor.graph.variables
    arguments = [None if name is None else (values[name] if name in values else variables[name].value)
                 for name in step.inputs]
    try:
        results = executor.run_operation(operation, arguments, quantized=quantized)
    except PPQLikeError:
        raise
    except Exception as error:  # name the node, as NumpyExecutor.forward does
        shapes = [None if a is None else list(np.shape(a)) for a in arguments]
        raise ExecutionError(f"{operation.type} node {operation.name!r} failed on input shapes {shapes}: "
                             f"{type(error).__name__}: {error}") from error
    for name, value in zip(step.outputs, results):
        values[name] = value
    for name in step.release:
        values.pop(name, None)
    return results


def run_steps(executor: NumpyExecutor, steps, values: dict, quantize: Callable[[Operation], bool]) -> dict:
    """Run ``steps`` in order on ``values`` (changed in place); ``quantize(op)`` picks each op's mode."""
    for step in steps:
        run_step(executor, step, values, quantize(step.operation))
    return values


def graph_outputs(executor: NumpyExecutor, values: dict, names) -> list[np.ndarray]:
    variables = executor.graph.variables
    return [np.asarray(values[name] if name in values else variables[name].value) for name in names]
