"""Blocks recognised by what they compute: a region of elementwise ops between one source and one result, run on
probe values.

Exporters spell a LayerNorm or a GELU in many ways (Pow 3 or Mul chains, the 0.5 anywhere, E[x^2] - E[x]^2,
ReduceSum times 1/n, Reciprocal of Sqrt or Pow -0.5, TensorFlow's ``x * k + (beta - mean * k)``...).  Instead of
one pattern per spelling, a finder names an *anchor* op (Erf, Tanh, Sqrt...), :func:`find_region` lists the
regions around it, and the finder's ``accept`` runs each region on probe values (:func:`evaluate`) and compares
what it computes with the block's formula.  A region is accepted by what it computes, so every spelling of the
same function is found, and nothing that computes something else is.

A *region* is a set of ops of :data:`PROBED_TYPES` such that

* every run-time value an op reads is the ``source`` or an output of another op of the set (constants, and the
  shape inputs of Reshape/Expand, aside);
* every output of an op but the ``result`` op is read only inside the set and is no graph output.

A region neither starts nor ends with a reshape or a cast, and its source is read by two ops or more.  Regions
are tried from the largest (the result farthest downstream of the anchor, the source farthest upstream) to the
smallest, so a block takes its gamma/beta and the mean it subtracts, not a part of itself.

Reads the graph, writes nothing.  :func:`evaluate` computes in float64 with numpy and knows only
:data:`PROBED_TYPES`, the ops blocks are written with (core sits below the executor and cannot run it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

import numpy as np

from .ir import Operation, Variable

__all__ = ["PROBED_TYPES", "Region", "ProbeError", "constant_value", "find_region", "evaluate", "reduction_axes",
           "pointwise_form"]

T = TypeVar("T")

#: How far (in ops) a region reaches upstream and downstream of its anchor, and its largest size.
UPSTREAM_REACH, DOWNSTREAM_REACH, MAX_REGION_OPS = 12, 8, 24

_erf = np.vectorize(math.erf, otypes=[np.float64])


class ProbeError(Exception):
    """A region cannot be run on the probe (an op or a shape the probe does not cover)."""


def constant_value(variable: Variable | None) -> np.ndarray | None:
    """The value of a parameter or of a Constant op's output (None for run-time values)."""
    if variable is None:
        return None
    if variable.is_parameter:
        return np.asarray(variable.value)
    producer = variable.producer
    if producer is not None and producer.type == "Constant" and "value" in producer.attributes:
        return np.asarray(producer.attributes["value"])
    return None


@dataclass(frozen=True)
class Region:
    """Ops (in dataflow order, ``result`` last) that compute ``result``'s output from ``source`` alone."""

    source: Variable
    operations: tuple[Operation, ...]

    @property
    def result(self) -> Operation:
        return self.operations[-1]

    def constants(self) -> list[Variable]:
        """The constants the region reads (each once), in the order the ops read them."""
        seen: dict[str, Variable] = {}
        for operation in self.operations:
            for slot, variable in enumerate(operation.inputs):
                if variable is not None and slot not in _static_slots(operation) and \
                        constant_value(variable) is not None:
                    seen.setdefault(variable.name, variable)
        return list(seen.values())

    def reductions(self) -> list[Operation]:
        return [op for op in self.operations if op.type in _REDUCTIONS]


def _static_slots(operation: Operation) -> tuple[int, ...]:
    """Input slots that hold shapes or axes (never the data)."""
    return (1,) if operation.type in _STATIC_SECOND_INPUT else ()


def _inputs(operation: Operation) -> list[Variable]:
    """The data inputs of ``operation`` that are computed at run time."""
    static = _static_slots(operation)
    return [v for slot, v in enumerate(operation.inputs)
            if v is not None and slot not in static and constant_value(v) is None]


def _upstream(anchor: Operation) -> list[Variable]:
    """Run-time values upstream of ``anchor`` through probed ops, farthest first, that two ops or more read
    (candidate sources: a norm or a GELU reads its source both as the value and inside the statistic or the
    gate)."""
    distance: dict[str, int] = {}
    found: dict[str, Variable] = {}
    queue = deque((v, 1) for v in _inputs(anchor))
    while queue:
        variable, depth = queue.popleft()
        if variable.name in distance:
            continue
        distance[variable.name], found[variable.name] = depth, variable
        producer = variable.producer
        if producer is not None and producer.type in PROBED_TYPES and depth < UPSTREAM_REACH:
            queue.extend((v, depth + 1) for v in _inputs(producer))
    return sorted((v for v in found.values() if len(set(map(id, v.consumers))) >= 2),
                  key=lambda v: -distance[v.name])


def _downstream(anchor: Operation) -> list[Operation]:
    """``anchor`` and the probed ops downstream of it, farthest first (candidate results)."""
    distance = {anchor.name: 0}
    found = {anchor.name: anchor}
    queue = deque([anchor])
    while queue:
        operation = queue.popleft()
        if distance[operation.name] >= DOWNSTREAM_REACH:
            continue
        for variable in operation.outputs:
            for consumer in variable.consumers:
                if consumer.type in PROBED_TYPES and consumer.name not in distance:
                    distance[consumer.name] = distance[operation.name] + 1
                    found[consumer.name] = consumer
                    queue.append(consumer)
    return sorted(found.values(), key=lambda op: -distance[op.name])


def _between(source: Variable, result: Operation, inputs_of: Callable) -> list[Operation] | None:
    """The ops computing ``result`` from ``source`` (dataflow order), or None when another run-time value
    enters, an op is not probed, or the region grows past :data:`MAX_REGION_OPS`."""
    order: list[Operation] = []
    state: dict[str, bool] = {}  # False: visiting, True: done
    stack: list[tuple[Operation, bool]] = [(result, False)]
    while stack:
        operation, expanded = stack.pop()
        if expanded:
            state[operation.name] = True
            order.append(operation)
            continue
        if operation.name in state:
            continue
        if operation.type not in PROBED_TYPES or len(state) >= MAX_REGION_OPS:
            return None
        state[operation.name] = False
        stack.append((operation, True))
        for variable in inputs_of(operation):
            if variable is source:
                continue
            if variable.producer is None:
                return None  # another graph input
            if variable.producer.name not in state:
                stack.append((variable.producer, False))
    return order


def _closed(operations: list[Operation], graph_outputs: set[str]) -> bool:
    names = {op.name for op in operations}
    for operation in operations[:-1]:
        for variable in operation.outputs:
            if variable.name in graph_outputs or any(c.name not in names for c in variable.consumers):
                return False
    return True


def find_region(anchor: Operation, accept: Callable[[Region], T | None], taken: set[str],
                graph_outputs: set[str]) -> T | None:
    """The first region around ``anchor`` (largest first, see the module docstring) that ``accept`` turns into
    something other than None; regions holding an op of ``taken`` are skipped."""
    sources = _upstream(anchor)
    cache: dict[str, list[Variable]] = {}

    def inputs_of(operation: Operation) -> list[Variable]:
        if operation.name not in cache:
            cache[operation.name] = _inputs(operation)
        return cache[operation.name]

    for result in _downstream(anchor):
        if result.type in _MOVERS:
            continue
        for source in sources:
            operations = _between(source, result, inputs_of)
            if operations is None or anchor not in operations or taken.intersection(op.name for op in operations):
                continue
            readers = [op for op in operations if source in op.inputs]
            if not readers or any(op.type in _MOVERS for op in readers) or not _closed(operations, graph_outputs):
                continue
            found = accept(Region(source, tuple(operations)))
            if found is not None:
                return found
    return None


# ------------------------------------------------------------------ the probe


@dataclass
class _Probe:
    """What :func:`evaluate` needs besides the values: the source's probe shape and the axes a Reshape or
    Expand with a run-time shape restores (the reduced axes of a norm)."""

    shape: tuple[int, ...]
    reduced_axes: tuple[int, ...]


def reduction_axes(operation: Operation) -> list[int] | None:
    """The axes of a Reduce/Squeeze/Unsqueeze op: its attribute, or its constant second input."""
    axes = operation.attributes.get("axes")
    if axes is None and len(operation.inputs) > 1 and operation.inputs[1] is not None:
        value = constant_value(operation.inputs[1])
        if value is None:
            raise ProbeError(f"{operation.name}: axes computed at run time")
        axes = value.reshape(-1).tolist()
    return None if axes is None or len(axes) == 0 else [int(a) for a in axes]


def _axes(operation: Operation, rank: int) -> tuple[int, ...] | None:
    axes = reduction_axes(operation)
    return None if axes is None else tuple(sorted(a % rank for a in axes))


def _reduce(function: Callable) -> Callable:
    def run(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
        data = values[0]
        axes = _axes(operation, data.ndim)
        if axes is None and operation.attributes.get("noop_with_empty_axes", 0):
            return data
        return function(data, axis=axes, keepdims=bool(operation.attributes.get("keepdims", 1)))
    return run


def _reshape(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    data, shape = values[0], constant_value(operation.inputs[1])
    if shape is not None:
        target = [data.shape[i] if s == 0 and not operation.attributes.get("allowzero", 0) else int(s)
                  for i, s in enumerate(shape.reshape(-1).tolist())]
        return data.reshape(target)
    kept = tuple(1 if axis in probe.reduced_axes else size for axis, size in enumerate(probe.shape))
    for target in (kept, probe.shape):  # a shape computed at run time: the reduced axes restored, or the source's
        if data.size == int(np.prod(target)):
            return data.reshape(target)
    raise ProbeError(f"{operation.name}: a run-time shape the probe cannot tell")


def _expand(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    shape = constant_value(operation.inputs[1])
    if shape is None:
        return values[0]  # the elementwise ops after it broadcast the same way
    return values[0] * np.ones(tuple(int(s) for s in shape.reshape(-1)))


def _cast(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    if operation.attributes.get("to") not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        raise ProbeError(f"{operation.name}: a cast to a non-float type")
    return values[0]


def _unsqueeze(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    axes = reduction_axes(operation) or []
    return np.expand_dims(values[0], _axes(operation, values[0].ndim + len(axes)))


def _squeeze(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    axes = _axes(operation, values[0].ndim)
    return np.squeeze(values[0], axis=axes)


def _elementwise(function: Callable) -> Callable:
    return lambda operation, values, probe: function(*values)


def _clip(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    """Clip with its bounds from its constant inputs (an absent bound does not clip)."""
    bounds = []
    for slot, default in ((1, -np.inf), (2, np.inf)):
        variable = operation.inputs[slot] if len(operation.inputs) > slot else None
        value = None if variable is None else constant_value(variable)
        if variable is not None and value is None:
            raise ProbeError(f"{operation.name}: a bound computed at run time")
        bounds.append(default if value is None else float(value.reshape(-1)[0]))
    return np.clip(values[0], *bounds)


def _hard_sigmoid(operation: Operation, values: list, probe: _Probe) -> np.ndarray:
    alpha, beta = operation.attributes.get("alpha", 0.2), operation.attributes.get("beta", 0.5)
    return np.clip(alpha * values[0] + beta, 0.0, 1.0)


_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum"})
#: Ops that move or retype values without computing: a region neither starts nor ends with one (the reshape
#: before or after a block is the strategy's business, not the block's).
_MOVERS = frozenset({"Reshape", "Expand", "Squeeze", "Unsqueeze", "Identity", "Cast"})
_STATIC_SECOND_INPUT = frozenset({"Reshape", "Expand", "ReduceMean", "ReduceSum", "Unsqueeze", "Squeeze"})
_KERNELS: Mapping[str, Callable] = {
    "Add": _elementwise(np.add), "Sub": _elementwise(np.subtract), "Mul": _elementwise(np.multiply),
    "Div": _elementwise(np.divide), "Pow": _elementwise(np.power), "Sqrt": _elementwise(np.sqrt),
    "Reciprocal": _elementwise(np.reciprocal), "Neg": _elementwise(np.negative), "Abs": _elementwise(np.abs),
    "Tanh": _elementwise(np.tanh), "Erf": _elementwise(_erf), "Sigmoid": _elementwise(lambda x: 1 / (1 + np.exp(-x))),
    "Max": _elementwise(lambda *v: np.maximum.reduce(np.broadcast_arrays(*v))),
    "Min": _elementwise(lambda *v: np.minimum.reduce(np.broadcast_arrays(*v))),
    "Exp": _elementwise(np.exp), "Log": _elementwise(np.log),
    "Softplus": _elementwise(lambda x: np.logaddexp(0.0, x)),
    "Relu": _elementwise(lambda x: np.maximum(x, 0.0)), "Clip": _clip, "HardSigmoid": _hard_sigmoid,
    "Identity": _elementwise(lambda x: x), "Cast": _cast,
    "ReduceMean": _reduce(np.mean), "ReduceSum": _reduce(np.sum),
    "Reshape": _reshape, "Expand": _expand, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze}

#: The op types a region may hold: the ones LayerNorms, GELUs and activations are written with.
PROBED_TYPES = frozenset(_KERNELS)


def evaluate(region: Region, probe: np.ndarray, reduced_axes: tuple[int, ...] = (),
             overrides: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The region's result for ``probe`` as its source, in float64 (constants from the graph, or from
    ``overrides`` by name).  Raises ProbeError when the region cannot run on it."""
    context = _Probe(tuple(probe.shape), tuple(reduced_axes))
    values: dict[str, np.ndarray] = {region.source.name: np.asarray(probe, np.float64)}
    overrides = overrides or {}
    with np.errstate(all="ignore"):
        for operation in region.operations:
            static = _static_slots(operation)
            arguments = []
            for slot, variable in enumerate(operation.inputs):
                if variable is None or slot in static:
                    continue
                if variable.name in overrides:
                    arguments.append(np.asarray(overrides[variable.name], np.float64))
                elif variable.name in values:
                    arguments.append(values[variable.name])
                else:
                    constant = constant_value(variable)
                    if constant is None or not np.issubdtype(constant.dtype, np.number):
                        raise ProbeError(f"{operation.name}: input {variable.name!r} is not known to the probe")
                    arguments.append(constant.astype(np.float64))
            try:
                output = _KERNELS[operation.type](operation, arguments, context)
            except (ValueError, IndexError, TypeError) as error:
                raise ProbeError(f"{operation.name}: {error}") from None
            values[operation.outputs[0].name] = np.asarray(output, np.float64)
    return values[region.result.outputs[0].name]


def pointwise_form(region: Region, allowed: frozenset, probe: np.ndarray, references: Mapping[str, np.ndarray],
                   tolerance: float):
    """(form, region, ()) when ``region`` - ops of ``allowed`` types reading scalar constants only - computes,
    on ``probe`` as its source, the reference curve ``form`` within ``tolerance`` (the closest one); else None.
    What GELU and the written-out activations are recognised by."""
    if any(op.type not in allowed for op in region.operations) or \
            any(constant_value(v).size != 1 for v in region.constants()):
        return None
    try:
        result = evaluate(region, probe)
    except ProbeError:
        return None
    if result.size != probe.size:
        return None
    result = result.reshape(-1)
    errors = {form: float(np.abs(result - reference).max()) for form, reference in references.items()}
    form = min(errors, key=errors.get)
    return (form, region, ()) if errors[form] <= tolerance else None
