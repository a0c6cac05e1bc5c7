"""Kernels of the sequence family: SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceAt,
SequenceErase, SequenceLength, SplitToSequence and ConcatFromSequence (opsets 11-23), and the optional
ones: Optional, OptionalHasElement and OptionalGetElement (opsets 15-23).

A sequence is a Python list of arrays; kernels never change the list they read (they return a new
one).  An optional is its value, or None when empty (as a missing input is).  Positions may be negative (counted from the end); one out of range is an ExecutionError.
"""

from __future__ import annotations

import numpy as np

from ...core.errors import ExecutionError
from .base import attribute, normalize_axis


def _position(op, sequence: list, value, insert: bool = False) -> int:
    """The position ``value`` (a 0-d or 1-element tensor) names in ``sequence``; insertion may be at its end."""
    position = int(np.asarray(value).reshape(-1)[0])
    length = len(sequence)
    limit = length if insert else length - 1
    if not -length <= position <= limit:
        raise ExecutionError(f"{op.type} node {op.name!r}: position {position} is out of range for a sequence of "
                             f"{length} tensors")
    return position + length if position < 0 else position


def _sequence_empty(op, opset):
    attribute(op, "dtype", 1)   # the element type: a list carries no type
    return lambda inputs: [[]]


def _sequence_construct(op, opset):
    return lambda inputs: [list(inputs)]


def _sequence_insert(op, opset):
    def kernel(inputs):
        sequence = list(inputs[0])
        position = len(sequence) if len(inputs) < 3 or inputs[2] is None else \
            _position(op, sequence, inputs[2], insert=True)
        sequence.insert(position, inputs[1])
        return [sequence]
    return kernel


def _sequence_at(op, opset):
    return lambda inputs: [inputs[0][_position(op, inputs[0], inputs[1])]]


def _sequence_erase(op, opset):
    def kernel(inputs):
        sequence = list(inputs[0])
        if not sequence:
            raise ExecutionError(f"SequenceErase node {op.name!r}: the sequence is empty")
        position = len(sequence) - 1 if len(inputs) < 2 or inputs[1] is None else _position(op, sequence, inputs[1])
        del sequence[position]
        return [sequence]
    return kernel


def _sequence_length(op, opset):
    return lambda inputs: [np.array(len(inputs[0]), np.int64)]


def _split_to_sequence(op, opset):
    axis = int(attribute(op, "axis", 0))
    keepdims = int(attribute(op, "keepdims", 1))

    def kernel(inputs):
        data = np.asarray(inputs[0])
        a = normalize_axis(axis, data.ndim)
        split = None if len(inputs) < 2 or inputs[1] is None else np.asarray(inputs[1], np.int64)
        if split is None:   # one slice per element along the axis
            parts = np.split(data, data.shape[a], axis=a) if data.shape[a] else []
            return [[np.squeeze(p, axis=a) if not keepdims else p for p in parts]]
        if split.ndim == 0:   # chunks of that size, the last one smaller
            size = int(split)
            if size <= 0:
                raise ExecutionError(f"SplitToSequence node {op.name!r}: split size {size} must be positive")
            cuts = list(range(size, data.shape[a], size))
        else:
            if int(split.sum()) != data.shape[a] or (split < 0).any():
                raise ExecutionError(f"SplitToSequence node {op.name!r}: split {split.tolist()} does not add up to "
                                     f"the axis length {data.shape[a]}")
            cuts = list(np.cumsum(split)[:-1])
        return [list(np.split(data, cuts, axis=a))]
    return kernel


def _concat_from_sequence(op, opset):
    axis = int(attribute(op, "axis"))
    new_axis = int(attribute(op, "new_axis", 0))

    def kernel(inputs):
        sequence = [np.asarray(x) for x in inputs[0]]
        if not sequence:
            raise ExecutionError(f"ConcatFromSequence node {op.name!r}: the sequence is empty")
        if new_axis:
            return [np.stack(sequence, axis=normalize_axis(axis, sequence[0].ndim + 1))]
        return [np.concatenate(sequence, axis=normalize_axis(axis, sequence[0].ndim))]
    return kernel


def _optional(op, opset):
    return lambda inputs: [inputs[0] if inputs else None]


def _optional_has_element(op, opset):
    return lambda inputs: [np.array(bool(inputs) and inputs[0] is not None)]


def _optional_get_element(op, opset):
    def kernel(inputs):
        if not inputs or inputs[0] is None:
            raise ExecutionError(f"OptionalGetElement node {op.name!r}: the optional is empty")
        return [inputs[0]]
    return kernel


KERNELS = {"SequenceEmpty": _sequence_empty, "SequenceConstruct": _sequence_construct,
           "SequenceInsert": _sequence_insert, "SequenceAt": _sequence_at, "SequenceErase": _sequence_erase,
           "SequenceLength": _sequence_length, "SplitToSequence": _split_to_sequence,
           "ConcatFromSequence": _concat_from_sequence, "Optional": _optional,
           "OptionalHasElement": _optional_has_element, "OptionalGetElement": _optional_get_element}
