"""Kernels of the control-flow family: If, Loop, Scan and SequenceMap (opsets 11-23).

Each runs its body (a Graph in the op's attributes, :mod:`ppqlike.core.subgraphs`) with a nested
:class:`~ppqlike.executor.NumpyExecutor` built once per body (``body=True``: it takes the values the
body reads from the enclosing scope with its inputs).  The op's implicit inputs (after its ONNX
inputs) are those values, matched by name.  A body carrying quantization configs runs quantized, as
any graph; hooks that reach bodies see its ops.  Values pass as they are (arrays, or lists for
sequences); the nested executor hands back copies.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

import numpy as np

from ...core.errors import ExecutionError
from ...core.subgraphs import captures, explicit_input_count
from .base import attribute, normalize_axis, unsupported


#: ``(hooks that reach bodies, runtime_kernels, executor class)`` of the forward running now, set by the executor
#: (``NumpyExecutor``): the bodies it runs take them up.
RUNNING: ContextVar[tuple | None] = ContextVar("ppqlike_running_forward", default=None)

#: Callbacks ``(body, values)`` told of every body run (what it reads: its inputs and captured values).
_OBSERVERS: ContextVar[tuple] = ContextVar("ppqlike_body_observers", default=())


@contextmanager
def observing_bodies(callback: Callable[[object, dict], None]):
    """While in the block, ``callback(body, values)`` is called before each body runs (calibration of the
    ops inside bodies collects the values each body sees this way)."""
    token = _OBSERVERS.set(_OBSERVERS.get() + (callback,))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


class _Bodies:
    """The nested executors of one op's bodies, made when a body first runs (one per body object)."""

    def __init__(self):
        self.executors: dict[tuple, object] = {}

    def run(self, body, values: dict) -> list:
        running = RUNNING.get()
        if running is None:
            raise ExecutionError("a body of If/Loop/Scan runs only inside a NumpyExecutor's forward or run_operation")
        _, runtime_kernels, executor_class = running
        executor = self.executors.get((id(body), runtime_kernels))
        if executor is None or executor.graph is not body:
            executor = executor_class(body, runtime_kernels=runtime_kernels, body=True)
            self.executors[(id(body), runtime_kernels)] = executor
        for observer in _OBSERVERS.get():
            observer(body, values)
        return executor.run_body(values)


def _scope(operation, inputs: list, body) -> dict:
    """The values ``body`` reads from the enclosing scope, by name, from the op's implicit inputs."""
    start = explicit_input_count(operation)
    given = {v.name: x for v, x in zip(operation.inputs[start:], inputs[start:]) if v is not None}
    values = {}
    for variable in captures(body):
        if variable.name not in given:
            raise ExecutionError(f"{operation.type} node {operation.name!r}: its body reads {variable.name!r} "
                                 "from the enclosing scope, which the op does not list as an input")
        values[variable.name] = given[variable.name]
    return values


def _condition(operation, value, what: str) -> bool:
    array = np.asarray(value)
    if array.size != 1:
        raise ExecutionError(f"{operation.type} node {operation.name!r}: {what} must hold one value, "
                             f"it has shape {list(array.shape)}")
    return bool(array.reshape(-1)[0])


def _if(op, opset):
    attribute(op, "then_branch")
    attribute(op, "else_branch")
    bodies = _Bodies()

    def kernel(inputs):
        body = op.attributes["then_branch" if _condition(op, inputs[0], "the condition") else "else_branch"]
        return bodies.run(body, _scope(op, inputs, body))
    return kernel


def _empty_like(variable) -> np.ndarray:
    """An empty stack of ``variable``'s values (a scan output of zero iterations)."""
    shape = variable.shape if variable.shape is not None and all(isinstance(d, int) for d in variable.shape) \
        else []
    return np.zeros([0, *shape], dtype=variable.dtype or np.float32)


def _loop(op, opset):
    body = attribute(op, "body")
    if len(body.inputs) < 2 or len(body.outputs) < len(body.inputs) - 1:
        raise unsupported(op, f"its body has {len(body.inputs)} inputs and {len(body.outputs)} outputs; a Loop "
                              "body takes the iteration number, the condition and the carried values, and "
                              "returns the condition, the carried values and the scan outputs")
    bodies = _Bodies()

    def kernel(inputs):
        body = op.attributes["body"]
        carried_count = len(body.inputs) - 2
        trip = None if inputs[0] is None else int(np.asarray(inputs[0]).reshape(-1)[0])
        going = True if len(inputs) < 2 or inputs[1] is None else _condition(op, inputs[1], "the condition")
        carried = list(inputs[2:2 + carried_count])
        scope = _scope(op, inputs, body)
        names = [v.name for v in body.inputs]
        scanned: list[list] = [[] for _ in body.outputs[1 + carried_count:]]
        iteration = 0
        while going and (trip is None or iteration < trip):
            values = dict(scope)
            values.update(zip(names, [np.array(iteration, np.int64), np.array(going), *carried]))
            outputs = bodies.run(body, values)
            going = _condition(op, outputs[0], "the body's condition output")
            carried = outputs[1:1 + carried_count]
            for stack, value in zip(scanned, outputs[1 + carried_count:]):
                stack.append(value)
            iteration += 1
        stacks = [np.stack(stack) if stack else _empty_like(variable)
                  for stack, variable in zip(scanned, body.outputs[1 + carried_count:])]
        return carried + stacks
    return kernel


def _scan(op, opset):
    body = attribute(op, "body")
    scan_count = int(attribute(op, "num_scan_inputs"))
    state_count = len(body.inputs) - scan_count
    output_count = len(body.outputs) - state_count
    if state_count < 0 or output_count < 0:
        raise unsupported(op, f"num_scan_inputs {scan_count} does not fit its body's {len(body.inputs)} inputs and "
                              f"{len(body.outputs)} outputs")
    input_axes = list(attribute(op, "scan_input_axes", [0] * scan_count))
    input_directions = list(attribute(op, "scan_input_directions", [0] * scan_count))
    output_axes = list(attribute(op, "scan_output_axes", [0] * output_count))
    output_directions = list(attribute(op, "scan_output_directions", [0] * output_count))
    if len(input_axes) != scan_count or len(input_directions) != scan_count \
            or len(output_axes) != output_count or len(output_directions) != output_count:
        raise unsupported(op, "its scan axes/directions attributes do not have one entry per scan input/output")
    bodies = _Bodies()

    def kernel(inputs):
        body = op.attributes["body"]
        states = list(inputs[:state_count])
        sequences = [np.asarray(x) for x in inputs[state_count:state_count + scan_count]]
        axes = [normalize_axis(int(a), x.ndim) for a, x in zip(input_axes, sequences)]
        lengths = {x.shape[a] for x, a in zip(sequences, axes)}
        if len(lengths) > 1:
            raise ExecutionError(f"Scan node {op.name!r}: its scan inputs have different lengths {sorted(lengths)}")
        length = lengths.pop() if lengths else 0
        scope = _scope(op, inputs, body)
        names = [v.name for v in body.inputs]
        scanned: list[list] = [[] for _ in range(output_count)]
        for step in range(length):
            slices = [np.take(x, length - 1 - step if direction else step, axis=a)
                      for x, a, direction in zip(sequences, axes, input_directions)]
            values = dict(scope)
            values.update(zip(names, states + slices))
            outputs = bodies.run(body, values)
            states = outputs[:state_count]
            for stack, value in zip(scanned, outputs[state_count:]):
                stack.append(value)
        results = []
        for stack, axis, direction, variable in zip(scanned, output_axes, output_directions,
                                                    body.outputs[state_count:]):
            if not stack:
                results.append(_empty_like(variable))
                continue
            stack = stack[::-1] if direction else stack
            results.append(np.stack(stack, axis=normalize_axis(int(axis), np.ndim(stack[0]) + 1)))
        return states + results
    return kernel


def _sequence_map(op, opset):
    """SequenceMap: the body runs once per element of the first input (a sequence); each further input is
    a sequence of the same length (element i read at run i) or a tensor (read whole at every run); each
    body output is collected into an output sequence."""
    attribute(op, "body")
    bodies = _Bodies()

    def kernel(inputs):
        body = op.attributes["body"]
        count = len(body.inputs)
        given = list(inputs[:count])
        length = len(given[0])
        for position, value in enumerate(given[1:], 1):
            if isinstance(value, list) and len(value) != length:
                raise ExecutionError(f"SequenceMap node {op.name!r}: input {position} is a sequence of {len(value)} "
                                     f"tensors, the first {length}")
        scope = _scope(op, inputs, body)
        names = [v.name for v in body.inputs]
        collected: list[list] = [[] for _ in body.outputs]
        for step in range(length):
            values = dict(scope)
            values.update(zip(names, [value[step] if isinstance(value, list) else value for value in given]))
            for stack, value in zip(collected, bodies.run(body, values)):
                stack.append(value)
        return collected
    return kernel


KERNELS = {"If": _if, "Loop": _loop, "Scan": _scan, "SequenceMap": _sequence_map}
