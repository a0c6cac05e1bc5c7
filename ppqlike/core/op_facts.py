"""Facts about ONNX op types, in one place: a few named sets and the channel axes of the computing ops.

These are facts about what an op computes, not policy (what a platform
quantizes lives in ``ppqlike.platforms``).  Every layer reads them from here.
"""

from __future__ import annotations

from types import MappingProxyType

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

#: Activations that fuse into the computing op before them (one quantization after both).
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Clip"})

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
