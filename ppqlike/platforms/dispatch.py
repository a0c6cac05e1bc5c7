"""The dispatcher: label every op TARGET (the quantized platform), FP32 or SOI.

:func:`dispatch_graph` reads the graph's structure and writes ``op.platform``
on every operation, nothing else (no edits, no configs).
:func:`quantization_boundaries` reads ``op.platform`` and writes nothing.

Every strategy first labels the shape-or-index region SOI
(:mod:`ppqlike.platforms.dispatch_soi`); SOI ops are never TARGET.  Ops whose
values depend on no activation (only parameters, or constants reshaped to a
computed shape) are *data-free*: they are FP32 under every strategy, because
they are folded or computed exactly in float and the TARGET op that reads
them quantizes their result like a parameter.  Parameters are variables, not
ops, and get no label; a parameter at an SOI slot (a Reshape's shape) is never
quantized, see :func:`ppqlike.platforms.dispatch_soi.soi_input_indices`.

Strategies (``dispatcher=``), for the remaining ops:

* ``conservative`` (default, as PPQ's): computing ops (Conv, ConvTranspose,
  Gemm, MatMul) of ``quantizable_types`` are TARGET; any other op of
  ``quantizable_types`` or of :data:`PASSTHROUGH_TYPES` is TARGET only when
  every run-time value it reads comes from a TARGET op (not from an FP32 op
  nor a graph input); everything else is FP32.
* ``aggressive``: conservative, then, to a fixpoint, (a) a passthrough op
  becomes TARGET when any producer or consumer of its values is TARGET, and
  (b) a connected run of FP32 ops of ``quantizable_types`` that has a TARGET
  producer and a TARGET consumer becomes TARGET.
* ``pointwise``: TARGET iff the op type is in ``quantizable_types``.
* ``allin``: every op is TARGET.

Transformer blocks (:mod:`ppqlike.core.patterns`) are labelled first, as the
platform's :class:`~ppqlike.platforms.quantizer.TransformerPolicy` says: a
``float`` block is FP32; a ``quantize`` block has its tail TARGET and its other
ops FP32 (its inside is computed in float, only its result is quantized).

Recurrent ops (LSTM, GRU, RNN) are labelled as the platform's ``recurrent``
treatment says: ``float`` FP32, ``quantize`` TARGET (X read quantized, the
outputs quantized, float inside; W, R and the states never quantized).

A ``dispatching_table`` pins ops by name, overriding the strategy, the
transformer policy and the recurrent treatment; the strategy then works around
the pinned labels.

If, Loop and Scan, and the sequence ops, are FP32 whatever the strategy or table says: they run in
float, the exported model quantizes and dequantizes at their boundaries where a neighbour is
quantized, and the ops inside a body are dispatched on their own (``optim.passes.bodies``).
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import networkx as nx

from ..core.errors import PlatformError
from ..core.ir import Graph, Operation, Variable
from ..core.patterns import ATTENTION_MATMUL, PROBABILITY_MATMUL, RESIDUAL_ADD, find_transformer_blocks
from .dispatch_outputs import output_writers
from .dispatch_soi import data_free_operations, soi_input_indices, soi_operations, value_inputs, value_uses
from ..core.op_facts import COMPUTING_TYPES, RECURRENT_TYPES, SEQUENCE_TYPES, VALUE_PRESERVING_TYPES
from ..core.subgraphs import has_bodies
from .target import TargetPlatform

_FP32, _SOI = TargetPlatform.FP32, TargetPlatform.SOI

#: Ops that keep the scale and offset of their data input (layout moves, selections, padding, max
#: pooling, and Concat once its inputs are aligned).  Under ``conservative`` they are TARGET when
#: the ops producing their values are TARGET, even if the platform does not list them.
PASSTHROUGH_TYPES = VALUE_PRESERVING_TYPES | frozenset({"Concat"})

_LABEL_NAMES = ("TARGET", "FP32", "SOI")


class _Context:
    """What a strategy reads: order, target, quantizable types, SOI and data-free sets, labels so far."""

    def __init__(self, graph: Graph, target: TargetPlatform, quantizable: frozenset):
        self.graph = graph
        self.order = graph.topological_sort()
        self.target = target
        self.quantizable = quantizable
        self.data_free = data_free_operations(graph, self.order)
        self.soi = soi_operations(graph, self.order, self.data_free)
        self.labels: dict[str, TargetPlatform] = {name: _SOI for name in self.soi}
        self.pinned: set[str] = set()
        self.block_tails: dict[str, str] = {}  # tail op name -> block kind

    def pin(self, pins: dict) -> None:
        """Fix the labels of pinned ops; strategies leave them alone."""
        self.labels.update(pins)
        self.pinned |= set(pins)

    def block_labels(self, transformer) -> dict[str, TargetPlatform]:
        """The labels ``transformer`` (a TransformerPolicy) gives the ops of each block; blocks touching SOI or
        data-free ops, and AttentionMatMul/ProbabilityMatMul/ResidualAdd ops that read fewer than two run-time
        values, are left to the strategy."""
        labels: dict[str, TargetPlatform] = {}
        for block in find_transformer_blocks(self.graph):
            if any(name in self.soi or name in self.data_free for name in block.operations):
                continue
            tail = self.graph.operations[block.tail]
            if block.kind in (ATTENTION_MATMUL, PROBABILITY_MATMUL, RESIDUAL_ADD) and len(self.producers(tail)) != 2:
                continue
            self.block_tails[block.tail] = block.kind
            quantized = transformer.treatment(block.kind) == "quantize"
            labels.update({name: _FP32 for name in block.operations})
            labels[block.tail] = self.target if quantized else _FP32
        return labels

    def recurrent_labels(self, treatment: str) -> dict[str, TargetPlatform]:
        """The label ``treatment`` ('float' or 'quantize') gives each recurrent op that is neither SOI nor
        data-free."""
        label = self.target if treatment == "quantize" else _FP32
        return {op.name: label for op in self.order
                if op.type in RECURRENT_TYPES and op.name not in self.soi and op.name not in self.data_free}

    def free(self) -> list[Operation]:
        """Ops a strategy may label: neither SOI nor pinned, in topological order."""
        return [op for op in self.order if op.name not in self.soi and op.name not in self.pinned]

    def is_target(self, operation: Operation | None) -> bool:
        return operation is not None and self.labels.get(operation.name) is self.target

    def producers(self, operation: Operation) -> list[Operation | None]:
        """Producers of the run-time values ``operation`` reads (None: a graph input).

        Parameters, data-free ops and SOI ops are constants here and are skipped.
        """
        found = []
        for _, variable in value_inputs(operation):
            if variable.is_parameter:
                continue
            producer = variable.producer
            if producer is not None and (producer.name in self.data_free or producer.name in self.soi):
                continue
            found.append(producer)
        return found

    def consumers(self, operation: Operation) -> list[Operation]:
        """Ops reading an output of ``operation`` through a value (non-SOI) slot."""
        return [consumer for variable in operation.outputs for consumer, index in value_uses(variable)
                if index not in soi_input_indices(consumer)]


def _conservative(ctx: _Context) -> None:
    for operation in ctx.free():
        label = _FP32
        if operation.name in ctx.data_free:
            pass
        elif operation.type in ctx.quantizable and operation.type in COMPUTING_TYPES:
            label = ctx.target
        elif operation.type in ctx.quantizable or operation.type in PASSTHROUGH_TYPES:
            producers = ctx.producers(operation)
            if producers and all(ctx.is_target(p) for p in producers):
                label = ctx.target
        ctx.labels[operation.name] = label


def _aggressive(ctx: _Context) -> None:
    _conservative(ctx)
    changed = True
    while changed:
        changed = False
        candidates = [op for op in ctx.free() if op.name not in ctx.data_free and ctx.labels[op.name] is _FP32]
        for operation in candidates:  # (a) passthrough ops next to a TARGET op
            if operation.type in PASSTHROUGH_TYPES and (
                    any(ctx.is_target(p) for p in ctx.producers(operation))
                    or any(ctx.is_target(c) for c in ctx.consumers(operation))):
                ctx.labels[operation.name] = ctx.target
                changed = True
        runs = nx.DiGraph()  # (b) runs of supported FP32 ops between TARGET ops
        runs.add_nodes_from(op.name for op in candidates
                            if op.type in ctx.quantizable and ctx.labels[op.name] is _FP32)
        for name in runs.nodes:
            for consumer in ctx.consumers(ctx.graph.operations[name]):
                if consumer.name in runs:
                    runs.add_edge(name, consumer.name)
        for component in nx.weakly_connected_components(runs):
            members = [ctx.graph.operations[name] for name in component]
            if any(ctx.is_target(p) for op in members for p in ctx.producers(op)) and \
                    any(ctx.is_target(c) for op in members for c in ctx.consumers(op)):
                for operation in members:
                    ctx.labels[operation.name] = ctx.target
                changed = True


def _pointwise(ctx: _Context) -> None:
    for operation in ctx.free():
        quantized = operation.name not in ctx.data_free and operation.type in ctx.quantizable
        ctx.labels[operation.name] = ctx.target if quantized else _FP32


def _allin(ctx: _Context) -> None:
    for operation in ctx.free():
        ctx.labels[operation.name] = _FP32 if operation.name in ctx.data_free else ctx.target


#: Dispatcher name -> strategy (reads the context, writes its labels).
DISPATCHERS: Mapping[str, Callable[[_Context], None]] = MappingProxyType({
    "conservative": _conservative, "aggressive": _aggressive, "pointwise": _pointwise, "allin": _allin})


def _pin_label(name: str, value, target: TargetPlatform) -> TargetPlatform:
    """The label a dispatching-table entry asks for (PlatformError for anything unusable)."""
    if isinstance(value, str) and value.strip().upper() == "TARGET":
        return target
    try:
        platform = TargetPlatform.parse(value)
    except PlatformError as error:
        raise PlatformError(f"dispatching table: op {name!r} is pinned to {value!r}, which is neither "
                            f"'TARGET', 'FP32', 'SOI' nor a platform ({error})") from None
    if platform is TargetPlatform.UNSPECIFIED:
        raise PlatformError(f"dispatching table: op {name!r} cannot be pinned to UNSPECIFIED; "
                            "use 'TARGET', 'FP32' or 'SOI'")
    if platform.is_quantized and platform is not target:
        raise PlatformError(f"dispatching table: op {name!r} is pinned to {platform.name}, but the graph is "
                            f"dispatched for {target.name}; use 'TARGET' or {target.name}")
    return platform


def _parse_pins(graph: Graph, table, target: TargetPlatform, soi: set[str]) -> dict:
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise PlatformError(f"dispatching_table must map op names to platforms, not a {type(table).__name__}")
    unknown = sorted(str(name) for name in table if name not in graph.operations)
    if unknown:
        raise PlatformError(f"dispatching table names {len(unknown)} op(s) the graph does not have: "
                            f"{unknown[:10]}{' ...' if len(unknown) > 10 else ''}")
    pins = {name: _pin_label(name, value, target) for name, value in table.items()}
    refused = sorted(name for name, label in pins.items() if label is target and name in soi)
    if refused:
        raise PlatformError(f"dispatching table pins shape-or-index op(s) {refused} to {target.name}: they "
                            "compute shapes or indices and are never quantized; pin them to FP32 or drop them")
    return pins


def dispatch_graph(graph: Graph, platform: TargetPlatform | str, quantizable_types: Iterable[str],
                   dispatcher: str = "conservative",
                   dispatching_table: Mapping[str, TargetPlatform | str] | None = None,
                   transformer=None, recurrent: str | None = None, float_outputs: bool = False) -> dict:
    """Write ``op.platform`` on every op of ``graph``: ``platform`` (TARGET), FP32 or SOI.

    ``quantizable_types``: the op types the platform's quantizer supports.
    ``dispatcher``: 'conservative', 'aggressive', 'pointwise' or 'allin' (see the
    module docstring).  ``dispatching_table``: {op name: TargetPlatform or
    'TARGET'/'FP32'/'SOI'} pins ops; unknown names, and SOI ops pinned to
    TARGET, raise PlatformError.  ``transformer``: the platform's
    TransformerPolicy (None: transformer blocks are left to the strategy).  ``recurrent``: the platform's
    treatment of LSTM/GRU/RNN, 'float' or 'quantize' (None: left to the strategy).  ``float_outputs``: the ops
    that write the model's outputs are then labelled FP32 unless pinned (:mod:`.dispatch_outputs`).
    Returns a summary: ``platform``,
    ``dispatcher``, ``counts`` {label: n}, a list of op names per label
    ('TARGET', 'FP32', 'SOI', topological order), ``types`` {label: {op type: n}}
    ``pinned`` {name: label}, ``blocks`` {block kind: {label of its tail: n blocks}} and ``float_outputs``
    (the output writers labelled FP32).
    """
    target = TargetPlatform.parse(platform)
    if not target.is_quantized:
        valid = ", ".join(p.name for p in TargetPlatform if p.is_quantized)
        raise PlatformError(f"cannot dispatch for {target.name}: it is not a quantized platform; "
                            f"choose one of {valid}")
    if isinstance(quantizable_types, str):
        raise PlatformError(f"quantizable_types must be a collection of op types, not the string "
                            f"{quantizable_types!r}")
    strategy = DISPATCHERS.get(str(dispatcher).strip().lower())
    if strategy is None:
        raise PlatformError(f"unknown dispatcher {dispatcher!r}; choose one of {', '.join(DISPATCHERS)}")
    ctx = _Context(graph, target, frozenset(quantizable_types))
    pins = _parse_pins(graph, dispatching_table, target, ctx.soi)
    if transformer is not None:
        ctx.pin({name: label for name, label in ctx.block_labels(transformer).items() if name not in pins})
    if recurrent is not None:
        if recurrent not in ("float", "quantize"):
            raise PlatformError(f"recurrent treatment {recurrent!r} is not 'float' or 'quantize'")
        ctx.pin({name: label for name, label in ctx.recurrent_labels(recurrent).items() if name not in pins})
    ctx.pin(pins)
    ctx.pin({op.name: _FP32 for op in ctx.order if op.name not in ctx.soi and (
        op.type in SEQUENCE_TYPES or has_bodies(op))})   # their bodies' ops are dispatched on their own
    strategy(ctx)
    writers = [name for name in output_writers(graph, ctx.order, ctx.labels, target, PASSTHROUGH_TYPES)
               if name not in pins] if float_outputs else []
    ctx.labels.update({name: _FP32 for name in writers})
    for operation in ctx.order:
        operation.platform = ctx.labels[operation.name]
    return {**_summary(ctx, str(dispatcher).strip().lower(), pins), "float_outputs": writers}


def _label_name(label: TargetPlatform) -> str:
    return "TARGET" if label.is_quantized else label.name


def _summary(ctx: _Context, dispatcher: str, pins: dict) -> dict:
    names: dict[str, list[str]] = {key: [] for key in _LABEL_NAMES}
    types: dict[str, Counter] = {key: Counter() for key in _LABEL_NAMES}
    for operation in ctx.order:
        key = _label_name(ctx.labels[operation.name])
        names[key].append(operation.name)
        types[key][operation.type] += 1
    return {"platform": ctx.target.name, "dispatcher": dispatcher,
            "counts": {key: len(names[key]) for key in _LABEL_NAMES}, **names,
            "types": {key: dict(types[key]) for key in _LABEL_NAMES},
            "pinned": {name: _label_name(label) for name, label in pins.items()},
            "blocks": _block_summary(ctx)}


def _block_summary(ctx: _Context) -> dict:
    """Block kind -> {label of its tail: number of blocks}."""
    summary: dict[str, Counter] = {}
    for tail, kind in ctx.block_tails.items():
        summary.setdefault(kind, Counter())[_label_name(ctx.labels[tail])] += 1
    return {kind: dict(counts) for kind, counts in summary.items()}


def _label_of(operation: Operation) -> str:
    if operation.platform is None:
        raise PlatformError(f"operation {operation.name!r} has no platform; run dispatch_graph first")
    return _label_name(TargetPlatform.parse(operation.platform))


def quantization_boundaries(graph: Graph, include_soi: bool = False) -> list[tuple[Variable, Operation, Operation]]:
    """``(variable, from_op, to_op)`` for every value read where a TARGET op feeds an FP32 op or the reverse.

    Reads ``op.platform`` (PlatformError if an op has none), writes nothing.
    Reads through SOI slots (a Reshape's shape) are no boundary; graph inputs
    and outputs are not listed (the quantizer handles them).  With
    ``include_soi`` TARGET <-> SOI value reads are listed too (an SOI op
    reading a quantized tensor, a TARGET op quantizing an SOI result).
    Ordered by the producer's topological position.
    """
    kinds = {"TARGET", "FP32", "SOI"} if include_soi else {"TARGET", "FP32"}
    labels = {op.name: _label_of(op) for op in graph.operations.values()}
    boundaries = []
    for producer in graph.topological_sort():
        for variable in producer.outputs:
            for consumer in dict.fromkeys(consumer for consumer, index in value_uses(variable)
                                          if index not in soi_input_indices(consumer)):
                pair = {labels[producer.name], labels[consumer.name]}
                if len(pair) == 2 and "TARGET" in pair and pair <= kinds:
                    boundaries.append((variable, producer, consumer))
    return boundaries
