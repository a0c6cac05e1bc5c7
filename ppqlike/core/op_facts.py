"""Facts about ONNX op types, in one place: a few named sets and the channel axes of the computing ops.

These are facts about what an op computes, not policy (what a platform
quantizes lives in ``ppqlike.platforms``).  Every layer reads them from here.
"""

from __future__ import annotations

from types import MappingProxyType

from .block_regions import constant_value
from .ir import Operation

#: Ops with a weight whose integer arithmetic needs a bias of scale S_input * S_weight (DESIGN.md §2).
COMPUTING_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})

#: Computing ops that take a bias as their third input.
BIAS_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm"})

#: Ops that move values without changing them: their output keeps the input's scale and offset.
VALUE_PRESERVING_TYPES = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool",
                                    "GlobalMaxPool", "Slice", "Gather", "Split", "Expand", "Tile",
                                    "Identity", "Dropout", "Pad", "SpaceToDepth", "DepthToSpace",
                                    "ReduceMax", "ReduceMin"})

#: Recurrent ops: a float recurrence inside one node (inputs X, W, R, B, sequence_lens, initial_h[, initial_c, P]).
#: Their MatMuls are not computing ops here: no platform policy quantizes W and R (see PlatformPolicy.recurrent).
RECURRENT_TYPES = frozenset({"LSTM", "GRU", "RNN"})

#: Ops whose values are sequences (lists of tensors) or optionals: never quantized, always run in float.
SEQUENCE_TYPES = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceErase",
                            "SequenceLength", "SplitToSequence", "ConcatFromSequence", "SequenceMap",
                            "Optional", "OptionalGetElement", "OptionalHasElement"})

#: Activations that fuse into the computing op before them (one quantization after both).
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Clip"})

#: Activations computed value by value (or row by row: Softmax) from one tensor, with at most constant
#: operands besides (a Clip's bounds, a PRelu's slope): no weight, no sum over other values.
POINTWISE_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid",
                                   "HardSwish", "Softplus", "Softsign", "Elu", "Selu", "Celu", "Gelu", "Erf", "Exp",
                                   "Softmax", "LogSoftmax"})

#: Elementwise ops that, with constant other operands, only shift or scale a tensor (a MatMul's bias Add).
AFFINE_TYPES = frozenset({"Add", "Sub", "Mul", "Div"})

#: Ops that pass their first input through unchanged at inference.
PASS_THROUGH_TYPES = frozenset({"Identity", "Dropout"})

#: Ops that commute with a positive per-channel scale: f(s * x) = s * f(x) for s > 0 (Relu, pooling, ...);
#: cross-layer equalization moves scales through them.
POSITIVELY_HOMOGENEOUS_TYPES = frozenset({"Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool",
                                          "GlobalAveragePool", "GlobalMaxPool", "Identity", "Dropout"})


_BOOLEAN_RESULTS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN",
                    "IsInf", "RegexFullMatch")
_INTEGER_RESULTS = ("Shape", "Size", "NonZero", "NonMaxSuppression", "ArgMax", "ArgMin", "QuantizeLinear",
                    "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "BitShift", "BitwiseAnd",
                    "BitwiseOr", "BitwiseXor", "BitwiseNot", "StringConcat", "StringNormalizer")

#: Outputs that are never floating point, whatever the input types: index lists, masks, counts, integer codes
#: and strings (op type -> output indices).  Read where a model declares no type for a tensor.
NON_FLOAT_OUTPUTS = MappingProxyType({
    **{op_type: frozenset({0}) for op_type in _BOOLEAN_RESULTS + _INTEGER_RESULTS},
    "TopK": frozenset({1}),                       # indices
    "MaxPool": frozenset({1}),                    # indices
    "Dropout": frozenset({1}),                    # mask
    "Unique": frozenset({1, 2, 3}),               # first indices, inverse indices, counts
    "DynamicQuantizeLinear": frozenset({0, 2}),   # codes, zero point
    "StringSplit": frozenset({0, 1}),             # substrings, counts
})

_FLOAT_TYPE_CODES = frozenset({1, 10, 11, 16})   # ONNX FLOAT, FLOAT16, DOUBLE, BFLOAT16


def output_is_non_float(operation: Operation, index: int) -> bool:
    """Whether output ``index`` of ``operation`` is never a float tensor (:data:`NON_FLOAT_OUTPUTS`, or a
    Cast to a type other than float16/32/64 and bfloat16)."""
    if operation.domain not in ("", "ai.onnx"):
        return False
    if operation.type == "Cast" and "to" in operation.attributes:
        return int(operation.attributes["to"]) not in _FLOAT_TYPE_CODES
    return index in NON_FLOAT_OUTPUTS.get(operation.type, ())


def weight_channel_axis(operation: Operation) -> int | None:
    """The output-channel axis of a computing op's weight (DESIGN.md §2), or None.

    Conv: 0 ([M, C/g, k...]); ConvTranspose: 1 ([C, M/g, k...]); Gemm: 0 with transB, else 1;
    MatMul: the last axis of a weight of rank >= 2.
    """
    weight = operation.inputs[1] if len(operation.inputs) > 1 else None
    rank = None if weight is None or weight.value is None else weight.value.ndim
    if operation.type == "Conv":
        return 0
    if operation.type == "ConvTranspose":
        return 1
    if operation.type == "Gemm":
        return 0 if operation.attributes.get("transB", 0) else 1
    if operation.type == "MatMul":
        return None if rank is None or rank < 2 else rank - 1
    return None


def output_channel_axis(operation: Operation) -> int:
    """The channel axis of a computing op's output: 1 for Conv/ConvTranspose (NCHW), the last for Gemm/MatMul."""
    return 1 if operation.type in ("Conv", "ConvTranspose") else -1


def output_channels(operation: Operation) -> int | None:
    """Number of output channels of a computing op, read from its weight (None: no constant weight)."""
    weight = operation.inputs[1].value if len(operation.inputs) > 1 and operation.inputs[1] is not None else None
    if weight is None:
        return None
    if operation.type == "ConvTranspose":
        return weight.shape[1] * int(operation.attributes.get("group", 1))
    axis = weight_channel_axis(operation)
    return None if axis is None else weight.shape[axis]


# ------------------------------------------------------------------ values a following op cannot take

#: Ops whose output is zero wherever their data input is zero, elementwise (the value-preserving moves aside,
#: which keep the very values): a zero a grid puts on their input reaches whatever reads their output.
_ZERO_KEEPING = frozenset({"Relu", "LeakyRelu", "PRelu", "Sqrt", "Abs", "Neg", "Sign"})


def zero_sensitive_inputs(operation: Operation) -> tuple[int, ...]:
    """Input slots where an exact zero gives an infinity or a NaN: Log's and Reciprocal's input, Div's divisor,
    the base of a Pow by a negative constant exponent.

    A quantization grid holds zero exactly and rounds every value smaller than half a step to it, so a tensor
    read there must not be on a grid (``ppqlike.optim.passes.refine`` keeps it float).  The other domains a
    grid cannot break are not listed: a grid keeps signs (zero is exact and rounding is monotone), so what is
    non-negative stays non-negative for Sqrt and for Pow by a fractional exponent.
    """
    if operation.type in ("Log", "Reciprocal"):
        return (0,)
    if operation.type == "Div" and len(operation.inputs) > 1:
        return (1,)
    if operation.type == "Pow" and len(operation.inputs) > 1:
        exponent = constant_value(operation.inputs[1])
        if exponent is not None and exponent.size and float(exponent.min()) < 0:
            return (0,)
    return ()


def zero_keeping_inputs(operation: Operation) -> tuple[int, ...]:
    """The data inputs of ``operation`` whose zeros come out as zeros at its output, elementwise: the inputs of
    a value-preserving move or a Concat, of Relu/LeakyRelu/PRelu/Sqrt/Abs/Neg/Sign, of a Mul, the numerator of
    a Div, the base of a Pow by a positive constant, the input of a Clip (or of a Max/Min with a constant)
    whose bounds do not lift zero.  A Clip(min > 0), a Max(x, eps > 0) or an Add of an eps is a guard: what
    it writes is never zero.  Reductions and computing ops are no walk-through (their output is zero only
    where a whole window is)."""
    kind = operation.type
    data = [slot for slot, variable in enumerate(operation.inputs) if variable is not None
            and constant_value(variable) is None]
    if kind in VALUE_PRESERVING_TYPES or kind in _ZERO_KEEPING:
        return tuple(slot for slot in data if slot == 0)
    if kind in ("Concat", "Mul"):
        return tuple(data)
    if kind == "Div":
        return tuple(slot for slot in data if slot == 0)
    if kind == "Pow":
        exponent = constant_value(operation.inputs[1]) if len(operation.inputs) > 1 else None
        return (0,) if 0 in data and exponent is not None and exponent.size and float(exponent.min()) > 0 else ()
    if kind == "Clip":
        low, high = (_bound(operation, slot, name) for slot, name in ((1, "min"), (2, "max")))
        return (0,) if 0 in data and (low is None or low <= 0) and (high is None or high >= 0) else ()
    if kind in ("Max", "Min") and len(data) == 1:
        bounds = [constant_value(v) for v in operation.inputs if v is not None and constant_value(v) is not None]
        lifts = any((float(b.max()) > 0) if kind == "Max" else (float(b.min()) < 0) for b in bounds)
        return () if lifts else tuple(data)
    return ()


def _bound(operation: Operation, slot: int, name: str) -> float | None:
    """A Clip bound: its constant input (opset 11+) or its attribute (before); None when absent or computed."""
    if slot < len(operation.inputs) and operation.inputs[slot] is not None:
        value = constant_value(operation.inputs[slot])
        return None if value is None else float(value.reshape(-1)[0])
    value = operation.attributes.get(name)
    return None if value is None else float(value)
