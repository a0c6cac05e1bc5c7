"""Moving a fused unit of ops to a higher precision: FP32, or a wider integer grid (INT16).

The accuracy target (:mod:`.mixed_precision`) decides *which* units move;
this module says what a move writes.

Units.  An op and the ops it is fused with are one unit: Conv -> Clip after
fusion quantizes once, at the Clip output, so moving the Conv alone would
leave that quantization point in place.  Ops are joined when an op's output
config is OVERLAPPED by a config of the op that reads it.  A unit is a
candidate when it owns a quantization point that is applied (ACTIVATED,
SLAVE or BAKED; bias, Clip bounds and Pad values, which follow their
masters, do not count).

To FP32 (:func:`move_to_fp32`):

* every config of another op that reads its scale from a config of the unit
  (OVERLAPPED or SLAVE, at any depth of the chain) is detached and becomes
  ACTIVATED with the scale and offset it used, so the rest of the graph
  stays quantized exactly as before and each op that reads a float tensor
  of the unit quantizes it on entry (the boundary of DESIGN.md section 4);
* every config of the unit's ops becomes FP32 (BAKED and PASSIVE_BAKED
  parameters are reset first) and the ops' ``platform`` becomes FP32, so
  exporters treat them as dispatched to FP32 (TPU-MLIR's qtable lists them).

To ``bits``-bit integers (:func:`move_to_wider_grid`, INT16 where the
platform runs it: onnxruntime through int16 QDQ, TIDL and DSPs natively):

* each activation the unit quantizes itself (an ACTIVATED config) gets a
  ``bits``-bit grid of the same kind (unsigned, signed, narrow) over the
  union of its 8-bit range and the FP32 range seen on the measured batches:
  min-max, since a 16-bit grid has the steps to spare that clipping saves
  at 8 bits.  Readers that are OVERLAPPED or SLAVE by it follow its grid
  (one tensor, one Q/DQ pair);
* each weight of the unit is quantized again at ``bits`` bits, min-max per
  channel or per tensor as the platform's policy says;
* each bias of the unit is int32 on a scale of its own (min-max, per
  channel where the weights are): the usual scale, input scale times
  weight scale, is about 2^16 times finer on a 16-bit layer and overflows
  int32.  It is not left float either: onnxruntime's optimizer then
  quantizes a float bias at input x weight scale itself, overflows, and
  the deployed layer computes garbage (found on MobileNetV2's first layer);
  Clip bounds and Pad values of the unit become FP32.

The ops keep their platform.  Reads and writes only the unit's configs (and
for FP32 the configs that read them); :func:`snapshot` / :func:`restore`
undo any number of moves exactly.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Graph, Operation
from ...core.rounding import RoundingPolicy
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.op_facts import VALUE_PRESERVING_TYPES
from ...core.quant_graph import configured_operations, master_chain
from ...platforms.target import TargetPlatform
from ..observers.minmax import MinMaxObserver

S = QuantizationStates
_OWNED = (S.ACTIVATED, S.SLAVE, S.BAKED)


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
def snapshot(graph: Graph) -> dict:
    """Every config's state and every op's platform, for :func:`restore`."""
    configs = {}
    for operation in configured_operations(graph):
        for config in _configs(operation):
            state = dict(config.__dict__)
            state["detail"] = dict(config.detail)   # (passes add their records to it in place)
            configs[id(config)] = (config, state)
    return {"configs": configs, "platforms": {op.name: op.platform for op in graph.operations.values()}}


def restore(graph: Graph, snapshot: dict) -> None:
    """Put back exactly what :func:`snapshot` saw."""
    for config, state in snapshot["configs"].values():
        config.__dict__.clear()
        config.__dict__.update(state)
    for name, platform in snapshot["platforms"].items():
        if name in graph.operations:
            graph.operations[name].platform = platform


def _release_readers(graph: Graph, unit: list[Operation], to_fp32: bool) -> int:
    """The configs of ops outside ``unit`` that read their scale from the unit's (OVERLAPPED/SLAVE under one of
    its configs) keep that int8 grid as their own (detached, ACTIVATED) or, ``to_fp32``, become FP32.
    Returns how many."""
    own = {id(c) for op in unit for c in _configs(op)}
    released = 0
    for operation in configured_operations(graph):
        if operation in unit:
            continue
        for config in _configs(operation):
            if config.state in (S.OVERLAPPED, S.SLAVE) and any(id(m) in own for m in master_chain(config)):
                if to_fp32:
                    config.reset()
                    config.state = S.FP32
                else:
                    config.detach(S.ACTIVATED)
                released += 1
        if to_fp32:   # a bias on S_input * S_weight whose input is now read float is float too
            for config in _configs(operation):
                if config.state in (S.PASSIVE, S.PASSIVE_INIT, S.PASSIVE_BAKED) and \
                        any(master.state is S.FP32 for master in config.masters):
                    config.reset()
                    config.baked_value = None
                    config.state = S.FP32
    return released


def move_to_fp32(graph: Graph, unit: list[Operation], readers: str = "detach") -> dict:
    """Make ``unit`` run in FP32 and keep everything else quantized as before (see the module docstring).

    ``readers='float'``: the configs of other ops that read their scale from the unit's instead become FP32
    (the unit's tensors are read float everywhere: where float tensors between layers cost nothing, as in
    TensorRT's placement)."""
    detached = _release_readers(graph, unit, to_fp32=readers == "float")
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


def move_to_float_format(graph: Graph, unit: list[Operation], fmt: str) -> dict:
    """Make ``unit`` run in the float format ``fmt`` (F16 or BF16, as TPU-MLIR's quantize table moves a layer):
    its own activation and weight configs become ``fmt`` grids with scale 1 (a plain cast, rounding half to even,
    no integer requantization), its bias, Clip bounds and Pad values FP32 (float in that mode); configs of other
    ops that read their scale from the unit's keep its int8 grid as their own (detached: the cast back to int8
    at the unit's boundary).  Configs the unit reads from outside it stay as they are."""
    detached = _release_readers(graph, unit, to_fp32=False)
    moved = 0
    for operation in unit:
        for side, index, config in operation.config.iter_configs():
            variable = (operation.inputs if side == "input" else operation.outputs)[index]
            if variable is None or config.state in (S.FP32, S.SOI, S.DEACTIVATED):
                continue
            if config.is_governed and config.state is not S.PASSIVE_BAKED and config.observer_algorithm != "passive":
                continue   # follows a master: inside the unit (then its new grid) or outside (its int8 grid)
            if config.state in (S.BAKED, S.PASSIVE_BAKED, S.DEQUANTIZED) or config.is_governed:
                config.reset()
            config.baked_value = None
            config.requantization = None
            if config.observer_algorithm == "passive":   # bias, Clip bounds, Pad values: float
                if config.state is not S.INITIAL:
                    config.reset()
                config.state = S.FP32
                continue
            config.reset()
            config.float_format = fmt
            config.rounding = RoundingPolicy.ROUND_HALF_EVEN
            config.observer_algorithm = "unit"
            per_channel = config.policy.per_channel and config.channel_axis is not None and variable.is_parameter
            count = np.asarray(variable.value).shape[config.channel_axis] if per_channel else 1
            config.set_scale_offset(np.ones(count) if per_channel else 1.0, 0)
            config.state = S.ACTIVATED
            moved += 1
    return {"detached": detached, "configs": moved}


def with_pass_through_readers(unit: list[Operation]) -> list[Operation]:
    """``unit`` and the value-preserving ops (Reshape, Transpose, MaxPool, ...) on the platform that read its
    results, and theirs in turn: moved with it, so that a tensor it leaves float is not quantized again at a
    Reshape's input (those ops only move values: their readers quantize what they need)."""
    members, frontier = list(unit), list(unit)
    while frontier:
        operation = frontier.pop()
        for variable in operation.outputs:
            for reader in variable.consumers:
                if reader.type in VALUE_PRESERVING_TYPES and reader.config is not None and reader not in members:
                    members.append(reader)
                    frontier.append(reader)
    return members


def reader_units(graph: Graph, unit: list[Operation], units: list[list[Operation]]) -> list[list[Operation]]:
    """The units (of ``units``) with an op that reads a tensor ``unit`` writes, ``unit`` itself excepted."""
    members = {op.name for op in unit}
    readers = {consumer.name for op in unit for variable in op.outputs for consumer in variable.consumers}
    return [other for other in units
            if not members & {op.name for op in other} and readers & {op.name for op in other}]


def _integer_range(config: TensorQuantizationConfig) -> tuple[float, float]:
    """The float range [S (qmin - Z), S (qmax - Z)] of a per-tensor config's grid."""
    scale, offset = float(np.asarray(config.scale).reshape(-1)[0]), int(np.asarray(config.offset).reshape(-1)[0])
    return scale * (config.quant_min - offset), scale * (config.quant_max - offset)


def _requantize_minmax(config: TensorQuantizationConfig, bits: int, values: np.ndarray) -> None:
    """Give an INITIAL or ACTIVATED ``config`` a ``bits``-bit grid holding ``values``, min-max, ACTIVATED."""
    config.num_of_bits = bits
    observer = MinMaxObserver(config)
    observer.observe(values)
    observer.render()
    if config.state is not S.ACTIVATED:
        config.state = S.ACTIVATED


def can_widen(unit: list[Operation]) -> bool:
    """Whether :func:`move_to_wider_grid` applies: every activation the unit quantizes itself is per tensor."""
    for operation in unit:
        for side, index, config in operation.config.iter_configs():
            variable = (operation.inputs if side == "input" else operation.outputs)[index]
            activation = variable is not None and not (side == "input" and variable.is_parameter)
            if config.state is S.ACTIVATED and activation and config.policy.per_channel:
                return False
    return True


def move_to_wider_grid(graph: Graph, unit: list[Operation], bits: int, observed: dict) -> dict:
    """Run ``unit`` on ``bits``-bit integers (see the module docstring).

    ``observed``: tensor name -> (min, max) of its FP32 values on the measured batches.
    """
    widened = {"activations": 0, "weights": 0, "own_scale_biases": 0}
    for operation in unit:
        for side, index, config in operation.config.iter_configs():
            variable = (operation.inputs if side == "input" else operation.outputs)[index]
            if variable is None or config.state in (S.FP32, S.SOI, S.DEACTIVATED):
                continue
            parameter = side == "input" and variable.is_parameter
            if parameter and config.observer_algorithm == "passive" and config.num_of_bits == 32:
                config.reset()  # a bias: int32 on a scale of its own, not S_input * S_weight
                config.baked_value = None
                _requantize_minmax(config, 32, np.asarray(variable.value))
                widened["own_scale_biases"] += 1
            elif parameter and config.observer_algorithm == "passive":  # Clip bounds, Pad values
                config.reset()
                config.state = S.FP32
            elif parameter:
                config.reset()
                config.baked_value = None
                _requantize_minmax(config, bits, np.asarray(variable.value))
                widened["weights"] += 1
            elif config.state is S.ACTIVATED and config.num_of_bits < bits:
                low, high = _integer_range(config)
                seen_low, seen_high = observed.get(variable.name, (low, high))
                _requantize_minmax(config, bits, np.array([min(low, seen_low), max(high, seen_high)]))
                widened["activations"] += 1
    return widened
