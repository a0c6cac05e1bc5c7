"""Facts about ONNX op types, in one place: a few named sets and the channel axes of the computing ops.

These are facts about what an op computes, not policy (what a platform
quantizes lives in ``ppqlike.platforms``).  Every layer reads them from here.
"""

from __future__ import annotations

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

#: Ops whose values are sequences (lists of tensors): never quantized, always run in float.
SEQUENCE_TYPES = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceErase",
                            "SequenceLength", "SplitToSequence", "ConcatFromSequence"})

#: Activations that fuse into the computing op before them (one quantization after both).
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Clip"})

#: Ops that pass their first input through unchanged at inference.
PASS_THROUGH_TYPES = frozenset({"Identity", "Dropout"})

#: Ops that commute with a positive per-channel scale: f(s * x) = s * f(x) for s > 0 (Relu, pooling, ...);
#: cross-layer equalization moves scales through them.
POSITIVELY_HOMOGENEOUS_TYPES = frozenset({"Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool",
                                          "GlobalAveragePool", "GlobalMaxPool", "Identity", "Dropout"})


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
