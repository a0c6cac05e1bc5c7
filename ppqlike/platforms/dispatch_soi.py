"""Shape-or-index (SOI) analysis: which ops compute shapes, indices and sizes, never values.

Reads the graph's structure only (ops, input slots, graph outputs); writes
nothing.  The dispatcher (:mod:`ppqlike.platforms.dispatch`) labels the ops
found here SOI; quantizers use :data:`SOI_INPUTS` to leave shape slots alone.

An op is SOI when

* it is a generator (:data:`SOI_GENERATORS`): its output is a shape, an
  index list or a shape-sized fill;
* forwards: every run-time value it reads comes from SOI ops (or constants),
  i.e. it is arithmetic on shapes (Shape -> Gather -> Unsqueeze -> Concat);
* backwards: every use of every output is through an SOI input slot of the
  consumer, or by a non-generator SOI op.  None of its outputs is a graph
  output.  A generator's own data input (NonZero's input, the boxes and
  scores of NonMaxSuppression) is a real data use: detection heads stay
  quantizable.

Both rules are iterated to a fixpoint over the networkx topological order.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from ..core.ir import Graph, Operation, Variable

#: The ONNX default domain's spellings; the tables apply to these ops only.
DEFAULT_DOMAINS = ("", "ai.onnx")

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

#: op type -> input indices whose values are shapes, indices, axes, sizes or counts
#: (or, for Shape/Size/*Like, inputs read only for their shape).  These inputs
#: are never quantized, and an op whose outputs feed only such slots is SOI.
#: Pad's constant value (input 2) and Clip's bounds are values, not SOI.
SOI_INPUTS: Mapping[str, frozenset] = MappingProxyType({
    **{op_type: frozenset({1}) for op_type in _REDUCE},   # axes (ReduceSum 13+, the others 18+)
    "Reshape": frozenset({1}),            # shape
    "Expand": frozenset({1}),             # shape
    "Tile": frozenset({1}),               # repeats
    "ConstantOfShape": frozenset({0}),    # shape
    "Range": frozenset({0, 1, 2}),        # start, limit, delta
    "Slice": frozenset({1, 2, 3, 4}),     # starts, ends, axes, steps
    "Gather": frozenset({1}),             # indices
    "GatherElements": frozenset({1}),     # indices
    "GatherND": frozenset({1}),           # indices
    "ScatterND": frozenset({1}),          # indices
    "ScatterElements": frozenset({1}),    # indices
    "Resize": frozenset({1, 2, 3}),       # roi, scales, sizes
    "Pad": frozenset({1, 3}),             # pads, axes (2 = constant value: a value)
    "Squeeze": frozenset({1}),            # axes (13+)
    "Unsqueeze": frozenset({1}),          # axes (13+)
    "Split": frozenset({1}),              # split sizes (13+)
    "TopK": frozenset({1}),               # k
    "OneHot": frozenset({0, 1}),          # indices, depth (2 = on/off values)
    "CumSum": frozenset({1}),             # axis
    "Trilu": frozenset({1}),              # k
    "Compress": frozenset({1}),           # condition
    "ReverseSequence": frozenset({1}),    # sequence_lens
    "RoiAlign": frozenset({1, 2}),        # rois (box corners), batch_indices
    "MaxRoiPool": frozenset({1}),         # rois (batch index and box corners)
    "MaxUnpool": frozenset({1, 2}),       # indices, output_shape
    "NonMaxSuppression": frozenset({2, 3, 4}),  # max boxes, IoU and score thresholds (control scalars)
    "CenterCropPad": frozenset({1}),      # shape
    "Col2Im": frozenset({1, 2}),          # image_shape, block_shape
    "AffineGrid": frozenset({1}),         # size
    "DFT": frozenset({1, 2}),             # dft_length, axis
    "STFT": frozenset({1, 3}),            # frame_step, frame_length
    "BlackmanWindow": frozenset({0}),     # size
    "MelWeightMatrix": frozenset({0, 1, 2, 3, 4}),  # bins, DFT length, sample rate, band edges (scalars)
    "RotaryEmbedding": frozenset({3}),    # position_ids
    "Attention": frozenset({3}),          # attn_mask (boolean, or an additive bias of -inf/large values)
    "TfIdfVectorizer": frozenset({0}),    # token ids
    "NegativeLogLikelihoodLoss": frozenset({1}),  # target classes
    "SoftmaxCrossEntropyLoss": frozenset({1}),    # labels
    # quantization ops a float model carries: their scales and zero points are quantization parameters
    "QuantizeLinear": frozenset({1, 2}),
    "DequantizeLinear": frozenset({1, 2}),
    "QLinearConv": frozenset({1, 2, 4, 5, 6, 7, 8}),   # scales, zero points, int32 bias
    "QLinearMatMul": frozenset({1, 2, 4, 5, 6, 7}),
    "ConvInteger": frozenset({2, 3}),
    "MatMulInteger": frozenset({2, 3}),
    "HannWindow": frozenset({0}),         # size
    "HammingWindow": frozenset({0}),      # size
    "Shape": frozenset({0}),              # read for its shape only
    "Size": frozenset({0}),               # read for its shape only
    "EyeLike": frozenset({0}),            # read for its shape only
    "RandomNormalLike": frozenset({0}),   # read for its shape only
    "RandomUniformLike": frozenset({0}),  # read for its shape only
})

#: Ops whose result is a shape, an index list or a shape-sized fill: always SOI.
SOI_GENERATORS = frozenset({"Shape", "Size", "NonZero", "NonMaxSuppression", "ConstantOfShape", "Range"})


def _onnx_type(operation: Operation) -> str | None:
    """The op type for default-domain ops, None for custom domains (no table applies)."""
    return operation.type if operation.domain in DEFAULT_DOMAINS else None


def soi_input_indices(operation: Operation) -> frozenset:
    """The input indices of ``operation`` that are SOI slots (see :data:`SOI_INPUTS`)."""
    return SOI_INPUTS.get(_onnx_type(operation), frozenset())


def is_generator(operation: Operation) -> bool:
    """True for the ops of :data:`SOI_GENERATORS` (default domain)."""
    return _onnx_type(operation) in SOI_GENERATORS


def value_inputs(operation: Operation) -> list[tuple[int, Variable]]:
    """``(index, variable)`` of every present input that is not an SOI slot: the values the op reads."""
    soi_slots = soi_input_indices(operation)
    return [(index, variable) for index, variable in enumerate(operation.inputs)
            if variable is not None and index not in soi_slots]


def value_uses(variable: Variable) -> Iterable[tuple[Operation, int]]:
    """``(consumer, index)`` for every slot reading ``variable``, SOI slots included."""
    for consumer in dict.fromkeys(variable.consumers):
        for index, current in enumerate(consumer.inputs):
            if current is variable:
                yield consumer, index


def data_free_operations(graph: Graph, order: list[Operation] | None = None) -> set[str]:
    """Names of ops whose values depend on no run-time activation.

    Every value input (not an SOI slot) is absent, a parameter or the output
    of another data-free op; the output may still depend on run-time shapes
    (Expand of a constant to a computed shape, EyeLike, ConstantOfShape).
    Random ops with no inputs count as data-free too.
    """
    order = graph.topological_sort() if order is None else order
    free: set[str] = set()
    for operation in order:
        if all(v.is_parameter or (v.producer is not None and v.producer.name in free)
               for _, v in value_inputs(operation)):
            free.add(operation.name)
    return free


def _computed_from_shapes(operation: Operation, soi: set[str], data_free: set[str]) -> bool:
    """Forward rule: every run-time value input comes from an SOI op (or a constant), at least one."""
    found = False
    for _, variable in value_inputs(operation):
        if variable.is_parameter:
            continue
        producer = variable.producer
        if producer is None:
            return False  # a graph input: run-time data
        if producer.name in soi:
            found = True
        elif producer.name not in data_free:
            return False
    return found


def _feeds_only_shapes(operation: Operation, soi: set[str], graph_outputs: set[int]) -> bool:
    """Backward rule: every use of every output is an SOI slot or a non-generator SOI op; at least one."""
    used = False
    for variable in operation.outputs:
        if id(variable) in graph_outputs:
            return False
        for consumer, index in value_uses(variable):
            used = True
            if index in soi_input_indices(consumer):
                continue
            if consumer.name in soi and not is_generator(consumer):
                continue
            return False
    return used


def soi_operations(graph: Graph, order: list[Operation] | None = None,
                   data_free: set[str] | None = None) -> set[str]:
    """Names of the SOI ops of ``graph`` (see the module docstring); reads only, writes nothing."""
    order = graph.topological_sort() if order is None else order
    data_free = data_free_operations(graph, order) if data_free is None else data_free
    graph_outputs = {id(v) for v in graph.outputs}
    soi = {op.name for op in order if is_generator(op)}
    changed = True
    while changed:
        changed = False
        for operation in order:
            if operation.name not in soi and _computed_from_shapes(operation, soi, data_free):
                soi.add(operation.name)
                changed = True
        for operation in reversed(order):
            if operation.name not in soi and _feeds_only_shapes(operation, soi, graph_outputs):
                soi.add(operation.name)
                changed = True
    return soi
