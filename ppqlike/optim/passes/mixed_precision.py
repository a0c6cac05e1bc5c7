"""Mixed-precision fallback: move the fewest ops to FP32 to reach a target output cosine (TPU-MLIR style).

1. Units.  An op and the ops it is fused with are one unit: Conv -> Clip
   after fusion quantizes once, at the Clip output, so moving the Conv alone
   to FP32 would leave that quantization point in place.  Ops are joined when
   an op's output config is OVERLAPPED by a config of the op that reads it.
   A unit is a candidate when it owns a quantization point that is applied
   (ACTIVATED, SLAVE or BAKED; bias, Clip bounds and Pad values, which follow
   their masters, do not count).
2. Sensitivity.  On ``batches`` calibration batches, each unit is quantized
   alone, everything else in float, and the cosine between the graph
   outputs and the FP32 outputs is measured (per sample, averaged; outputs
   averaged).  The FP32 intermediate values of the batch are computed once
   and only the ops downstream of the unit are run again, so a unit costs
   a partial forward pass.
3. Greedy.  Starting from the quantized graph, units are moved to FP32 worst
   first (lowest cosine when quantized alone), the whole quantized graph
   being measured again after every move, until the target cosine is
   reached (or ``max_ops`` ops are in FP32, or no candidate is left).  Then
   each moved unit is tried back in the quantized graph, latest first, and
   stays quantized if the target still holds, so no unit is in FP32 that
   the target does not need.

Moving a unit to FP32 (what the pass writes, in this order):

* every config of another op that reads its scale from a config of the unit
  (OVERLAPPED or SLAVE, at any depth of the chain: a consumer's input that
  the unit's output quantized, a later reader of a graph input whose first
  reader is in the unit, Concat inputs slaved to its output) is detached
  and becomes ACTIVATED with the scale and offset it used, so the rest of
  the graph stays quantized exactly as before and each TARGET op that reads
  a float tensor of the unit quantizes it on entry (the boundary of
  DESIGN.md section 4);
* every config of the unit's ops becomes FP32 (BAKED and PASSIVE_BAKED
  parameters, which may only be dequantized, are reset first), and the ops'
  ``platform`` becomes FP32, so exporters treat them as dispatched to FP32
  (TPU-MLIR's qtable lists their outputs as F32).

Reads: the configs of every TARGET op, after calibration, alignment and the
passive pass (and after AdaRound / bias correction when they run); the
executor and the calibration data.
Writes: the states above; ``graph.metadata['quantization']
['mixed_precision_fp32_ops']`` (the op names moved to FP32).  The search
itself works on snapshots of the configs and restores them exactly between
trials.  No 16-bit fallback: every moved op is FP32.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import configured_operations, master_chain
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass, iterate_calibration

S = QuantizationStates
_OWNED = (S.ACTIVATED, S.SLAVE, S.BAKED)


# ------------------------------------------------------------------ metrics
def output_cosine(outputs: list, references: list) -> float:
    """Mean over outputs of the per-sample cosine between ``outputs`` and ``references``."""
    values = []
    for got, want in zip(outputs, references):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.ndim >= 2:
            got, want = got.reshape(got.shape[0], -1), want.reshape(want.shape[0], -1)
        else:
            got, want = got.reshape(1, -1), want.reshape(1, -1)
        dot = np.sum(got * want, axis=1)
        norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
        cos = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0),
                       np.where(np.all(got == want, axis=1), 1.0, 0.0))
        values.append(float(np.mean(cos)))
    return float(np.mean(values)) if values else 1.0


# ------------------------------------------------------------ graph facts
def _configs(operation: Operation) -> list[TensorQuantizationConfig]:
    return operation.config.all_configs() if operation.config is not None else []


def _owner_map(graph: Graph) -> dict[int, Operation]:
    return {id(c): op for op in configured_operations(graph) for c in _configs(op)}


def find_units(graph: Graph) -> list[list[Operation]]:
    """Ops of each fused unit (topological order), for the units that own an applied quantization point."""
    order = [op for op in configured_operations(graph)]
    position = {op.name: i for i, op in enumerate(order)}
    owner = _owner_map(graph)
    parent = {op.name: op.name for op in order}

    def find(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for operation in order:
        for index, config in enumerate(operation.config.output_quantization_config):
            if config is None or config.state is not S.OVERLAPPED:
                continue
            readers = {c.name for c in operation.outputs[index].consumers}
            for master in master_chain(config):
                reader = owner.get(id(master))
                if reader is not None and reader.name in readers:
                    parent[find(operation.name)] = find(reader.name)
                    break
    groups: dict[str, list[Operation]] = {}
    for operation in order:
        groups.setdefault(find(operation.name), []).append(operation)
    units = []
    for members in groups.values():
        owns = False
        for operation in members:
            for side, index, config in operation.config.iter_configs():
                variable = (operation.inputs if side == "input" else operation.outputs)[index]
                passive_slot = side == "input" and index > 0 and config.observer_algorithm == "passive"
                if config.state in _OWNED and not passive_slot and variable is not None:
                    owns = True
        if owns:
            units.append(sorted(members, key=lambda op: position[op.name]))
    units.sort(key=lambda unit: position[unit[0].name])
    return units


# --------------------------------------------------------------- snapshots
def _snapshot(graph: Graph) -> dict:
    configs = {}
    for operation in configured_operations(graph):
        for config in _configs(operation):
            configs[id(config)] = (config, dict(config.__dict__))
    return {"configs": configs, "platforms": {op.name: op.platform for op in graph.operations.values()}}


def _restore(graph: Graph, snapshot: dict) -> None:
    for config, state in snapshot["configs"].values():
        config.__dict__.clear()
        config.__dict__.update(state)
    for name, platform in snapshot["platforms"].items():
        if name in graph.operations:
            graph.operations[name].platform = platform


def move_to_fp32(graph: Graph, unit: list[Operation]) -> dict:
    """Make ``unit`` run in FP32 and keep everything else quantized as before (see the module docstring)."""
    own = {id(c) for op in unit for c in _configs(op)}
    detached = 0
    for operation in configured_operations(graph):
        if operation in unit:
            continue
        for config in _configs(operation):
            if config.state in (S.OVERLAPPED, S.SLAVE) and any(id(m) in own for m in master_chain(config)):
                config.detach(S.ACTIVATED)
                detached += 1
    for operation in unit:
        for config in _configs(operation):
            if config.state in (S.FP32, S.SOI):
                continue
            if config.state in (S.BAKED, S.PASSIVE_BAKED, S.DEQUANTIZED):
                config.reset()
                config.baked_value = None
            config.state = S.FP32
        operation.platform = TargetPlatform.FP32
    return {"detached": detached}


# ---------------------------------------------------------------- running
class _Runner:
    """FP32 intermediates of one batch, and partial re-runs with one unit quantized."""

    def __init__(self, graph: Graph, executor: NumpyExecutor):
        self.graph, self.executor = graph, executor
        self.order = graph.topological_sort()
        self.index = {op.name: i for i, op in enumerate(self.order)}
        self.outputs = [v.name for v in graph.outputs]
        self.downstream: dict[str, list[Operation]] = {}

    def cache(self, batch) -> dict:
        names = [v.name for op in self.order for v in op.outputs]
        with dequantized(self.graph):
            values = self.executor.forward(batch, output_names=names)
        cached = dict(zip(names, values))
        cached.update(self.executor.prepare_inputs(batch))
        return cached

    def _plan(self, unit: list[Operation]) -> list[Operation]:
        key = "|".join(op.name for op in unit)
        if key not in self.downstream:
            reached = set()
            for operation in unit:
                reached.add(operation.name)
                reached |= {op.name for op in self.graph.descendants(operation)}
            self.downstream[key] = sorted((self.graph.operations[n] for n in reached),
                                          key=lambda op: self.index[op.name])
        return self.downstream[key]

    def quantize_alone(self, unit: list[Operation], cached: dict) -> list[np.ndarray]:
        """Graph outputs with only ``unit`` quantized (FP32 values elsewhere, recomputed downstream)."""
        members = {op.name for op in unit}
        values: dict = {}
        variables = self.graph.variables
        for operation in self._plan(unit):
            arguments = []
            for variable in operation.inputs:
                if variable is None:
                    arguments.append(None)
                elif variable.name in values:
                    arguments.append(values[variable.name])
                elif variable.name in cached:
                    arguments.append(cached[variable.name])
                else:
                    arguments.append(variables[variable.name].value)
            results = self.executor.run_operation(operation, arguments, quantized=operation.name in members)
            for variable, value in zip(operation.outputs, results):
                values[variable.name] = value
        return [values[n] if n in values else cached[n] for n in self.outputs]


class MixedPrecisionPass(QuantizationOptimizationPass):
    """Move the fewest fused units to FP32 so the output cosine reaches ``target`` (see the module docstring).

    ``batches``: calibration batches to measure on; ``max_ops``: most ops to
    move (None: no limit); ``prune``: try moved units back afterwards.
    """

    name = "mixed_precision"

    def __init__(self, target: float = 0.99, batches: int = 2, max_ops: int | None = None, prune: bool = True,
                 verbose: bool = True):
        if not -1.0 < float(target) <= 1.0:
            raise ValueError(f"mixed-precision target cosine must be in (-1, 1], got {target}")
        self.target, self.batches, self.max_ops = float(target), int(batches), max_ops
        self.prune, self.verbose = prune, verbose

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        executor = executor or NumpyExecutor(graph)
        steps = self.batches if calib_steps is None else min(self.batches, calib_steps)
        data = list(iterate_calibration(dataloader, steps, collate_fn, "mixed precision data", False))
        runner = _Runner(graph, executor)
        references = []
        units = find_units(graph)
        sensitivity = {i: 0.0 for i in range(len(units))}
        for batch in data:
            cached = runner.cache(batch)
            references.append([cached[n] for n in runner.outputs])
            for i, unit in enumerate(units):
                sensitivity[i] += output_cosine(runner.quantize_alone(unit, cached), references[-1]) / len(data)
            del cached
        measured = 0

        def measure() -> float:
            nonlocal measured
            measured += 1
            return float(np.mean([output_cosine(executor.forward(b), r) for b, r in zip(data, references)]))

        initial = current = measure()
        original = _snapshot(graph)
        ranking = sorted(range(len(units)), key=lambda i: sensitivity[i])
        chosen: list[int] = []
        trace = []
        for i in ranking:
            if current >= self.target:
                break
            count = sum(len(units[j]) for j in chosen) + len(units[i])
            if self.max_ops is not None and count > self.max_ops:
                continue
            move_to_fp32(graph, units[i])
            chosen.append(i)
            current = measure()
            trace.append({"unit": [op.name for op in units[i]], "cosine": current})
        if self.prune and current >= self.target and len(chosen) > 1:
            for i in list(reversed(chosen[:-1])):
                trial = [j for j in chosen if j != i]
                _restore(graph, original)
                for j in trial:
                    move_to_fp32(graph, units[j])
                cosine = measure()
                if cosine >= self.target:
                    chosen, current = trial, cosine
                    trace.append({"restored": [op.name for op in units[i]], "cosine": cosine})
            _restore(graph, original)
            for j in chosen:
                move_to_fp32(graph, units[j])
        fp32_ops = [op.name for j in chosen for op in units[j]]
        graph.metadata.setdefault("quantization", {})["mixed_precision_fp32_ops"] = list(fp32_ops)
        worst = [{"unit": [op.name for op in units[i]], "cosine_alone": round(sensitivity[i], 6)}
                 for i in ranking[:10]]
        return {"target": self.target, "initial_cosine": initial, "final_cosine": current,
                "reached": bool(current >= self.target), "fp32_op_count": len(fp32_ops), "fp32_ops": fp32_ops,
                "units": len(units), "measurements": measured, "batches": len(data),
                "seconds": round(time.perf_counter() - started, 3), "most_sensitive": worst, "trace": trace}
