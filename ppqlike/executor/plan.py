"""The NumpyExecutor's execution plan: which ops run in what order, when each value is freed, and
what runs merged (fusions, folded Pads, expansion chains and their projections: ``fusion``).

Built once per graph revision and set of requested outputs; reads the graph, writes nothing.  A forward
stores each step's results (``store_results``) and frees what no later step reads (``release_values``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import ExecutionError
from ..core.ir import Graph, Operation
from .fusion import activation_partners, chain_projections, expand_chains, pad_folds
from .ops import Kernel


@dataclass
class Step:
    """One op of the plan and the names of the values it reads, writes and is the last to read."""
    operation: Operation
    kernel: Kernel
    inputs: tuple          # variable names (None for omitted inputs)
    outputs: tuple         # variable names
    release: tuple         # names whose last reader is this step


@dataclass
class Plan:
    """The steps in run order, the graph inputs they read, and what runs merged (by step index)."""
    steps: list
    needed_inputs: tuple
    fusions: dict = field(default_factory=dict)   # step index of a Conv -> step index of its Relu/Clip
    pad_folds: frozenset = frozenset()  # step indices of Pads whose Convs can pad instead (fusion.pad_folds)
    chains: dict = field(default_factory=dict)   # 1x1 Conv -> its depthwise Conv run with it (fusion.expand_chains)
    projections: dict = field(default_factory=dict)   # 1x1 Conv of a chain -> the 1x1 after it and its Relu/Clip


def build_plan(graph: Graph, output_names: tuple, kernel_of, outer: frozenset = frozenset()) -> Plan:
    """The plan computing ``output_names`` of ``graph``; ``kernel_of(operation)`` gives each op's kernel;
    ``outer``: names a body reads from its enclosing scope (given with its inputs at run time).
    Unknown tensors and inputs nothing produces raise ExecutionError."""
    for name in output_names:
        if name not in graph.variables:
            raise ExecutionError(f"graph {graph.name!r} has no tensor named {name!r} to output")
    # Keep only the ops the requested outputs depend on.
    needed: set[str] = set()
    frontier = [graph.variables[n] for n in output_names]
    while frontier:
        variable = frontier.pop()
        producer = variable.producer
        if producer is None or producer.name in needed:
            continue
        needed.add(producer.name)
        frontier.extend(v for v in producer.inputs if v is not None)
    # Ops computed from constants alone first (EfficientNet-Lite0's Pad widths, which its export computes
    # after the 1x1 Conv whose chain through the Pad must know them), then the rest, each in graph order.
    varying = graph.input_dependent()
    order = [op for op in graph.topological_sort() if op.name in needed]
    order = [op for op in order if op.name not in varying] + [op for op in order if op.name in varying]
    graph_inputs = {v.name for v in graph.inputs} | outer
    last_use: dict[str, int] = {}
    for index, operation in enumerate(order):
        for variable in operation.inputs:
            if variable is None:
                continue
            if variable.producer is None and not variable.is_parameter and variable.name not in graph_inputs:
                raise ExecutionError(
                    f"graph {graph.name!r}: input {variable.name!r} of {operation.type} node "
                    f"{operation.name!r} is not produced by any node, nor a graph input or parameter")
            last_use[variable.name] = index
    keep = set(output_names)
    releases: dict[int, list] = {}
    for name, index in last_use.items():
        variable = graph.variables[name]
        if name not in keep and not variable.is_parameter:
            releases.setdefault(index, []).append(name)
    steps = [
        Step(op, kernel_of(op), tuple(None if v is None else v.name for v in op.inputs),
             tuple(v.name for v in op.outputs), tuple(releases.get(i, ())))
        for i, op in enumerate(order)]
    needed_inputs = tuple(n for n in (v.name for v in graph.inputs)
                          if n in last_use or n in keep)
    partners = activation_partners(order, keep)
    folds = pad_folds(order, keep, graph.opset)
    chains = expand_chains(order, keep, partners, folds)
    return Plan(steps, needed_inputs, partners, folds, chains, chain_projections(order, keep, chains, partners))


def release_values(step: Step, values: dict) -> None:
    """Drop the values whose last reader is ``step``."""
    for name in step.release:
        values.pop(name, None)


def store_results(names: tuple, results: list, key: tuple | None, values: dict, grids: dict) -> None:
    """Results under their names, recorded on grid ``key`` (None: on none)."""
    for name, value in zip(names, results):
        values[name] = value
        if key is None:
            grids.pop(name, None)
        else:
            grids[name] = key
