"""The checks and shapes of quantization parameters, shared by the float formulas (``numerics``) and the
integer one (``requantization``): the integer dtype of a range, a checked range, per-channel parameters laid
along their axis, integer-valued offsets."""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import QuantizationStateError


def integer_dtype(quant_min: int, quant_max: int) -> np.dtype:
    """int32 when [quant_min, quant_max] fits int32, else int64."""
    info = np.iinfo(np.int32)
    return np.dtype(np.int32) if info.min <= quant_min and quant_max <= info.max else np.dtype(np.int64)


def check_range(quant_min, quant_max) -> tuple[int, int]:
    """(quant_min, quant_max) as ints; QuantizationStateError unless quant_min < quant_max."""
    qmin, qmax = int(quant_min), int(quant_max)
    if qmin >= qmax:
        raise QuantizationStateError(f"quant_min {qmin} must be below quant_max {qmax}")
    return qmin, qmax


def along_channel_axis(param, ndim: int, shape, channel_axis, what: str = "value"):
    """Reshape a per-channel 1-D ``param`` to broadcast against an array of ``shape`` (``ndim`` axes)
    along ``channel_axis``; a scalar (or one value with no axis) stays a scalar.  Raises when the
    count does not match the axis."""
    param = np.asarray(param)
    if param.ndim == 0 or (param.size == 1 and channel_axis is None):
        return param.reshape(())
    if param.ndim != 1:
        raise QuantizationStateError(f"{what} must be a scalar or 1-D per-channel array, got shape {param.shape}")
    if channel_axis is None:
        raise QuantizationStateError(f"per-channel {what} (length {param.size}) needs a channel_axis")
    axis = channel_axis + ndim if channel_axis < 0 else channel_axis
    if not 0 <= axis < ndim:
        raise QuantizationStateError(f"channel_axis {channel_axis} out of range for a {ndim}-D tensor")
    if shape[axis] != param.size and param.size != 1:
        raise QuantizationStateError(
            f"per-channel {what} has {param.size} values but axis {channel_axis} has {shape[axis]} channels")
    new_shape = [1] * ndim
    new_shape[axis] = param.size
    return param.reshape(new_shape)


def offset_array(offset, dtype, ndim, shape, channel_axis):
    """An integer-valued offset as ``dtype``, laid along ``channel_axis`` (``along_channel_axis``); None for a
    scalar 0 (nothing to add)."""
    z = np.asarray(offset)
    if z.ndim == 0 and z == 0:
        return None
    if not np.issubdtype(z.dtype, np.integer):
        if not np.all(z == np.round(z)):
            raise QuantizationStateError(f"offset must be integer-valued, got {z!r}")
    return along_channel_axis(z.astype(dtype), ndim, shape, channel_axis, "offset")
