"""QDQ export of floating-point grids (``ppqlike.core.float_formats``): what ``export.qdq`` writes for a config
whose ``float_format`` is set.

* FP8 (E4M3FN, E5M2): QuantizeLinear → DequantizeLinear at opset 19 with a float8 zero point (0, the type says
  the format; ``saturate`` left at its default 1), per channel with ``axis``; a parameter becomes a float8
  initializer of its codes → DequantizeLinear.  onnxruntime runs both on its CPU provider.
* FP16, BF16 (no QuantizeLinear type): Cast to the format → Cast back to float, between a Div and a Mul by the
  scale when it is not 1; a parameter becomes a float16/bfloat16 initializer → Cast (→ Mul).

Either way onnxruntime computes cast(x / S) * S as the simulation does, bit for bit.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..core.errors import ExportError
from ..core.float_formats import encode_format

__all__ = ["FLOAT_OPSET", "float_pair", "add_float_pair", "float_parameter"]

#: QuantizeLinear/DequantizeLinear take float8 types from opset 19.
FLOAT_OPSET = 19


def float_pair(fmt, scale: np.ndarray, axis, who: str) -> tuple:
    """The fields of the pair of a float grid: (scale, zero point 0 as float32 - the format says its type -,
    axis, no clip, the format)."""
    if fmt.onnx_type not in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2) and scale.ndim and np.any(scale != 1):
        raise ExportError(f"{who}: a per-channel {fmt.name} scale other than 1 has no Cast form; use scale 1")
    return np.asarray(scale, np.float32), np.zeros(scale.shape, np.float32), axis, None, fmt


def _float8_constant(builder, base: str, codes: np.ndarray, fmt) -> str:
    """An initializer of the format's type holding ``codes`` (its bit patterns)."""
    key = (base, fmt.name, codes.shape, codes.tobytes())
    name = builder.initializer_keys.get(key)
    if name is None:
        name = builder.initializer_keys[key] = builder.unique(base)
        builder.initializers.append(helper.make_tensor(name, fmt.onnx_type, list(codes.shape),
                                                       np.ascontiguousarray(codes).tobytes(), raw=True))
    return name


def _is_float8(fmt) -> bool:
    return fmt.onnx_type in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)


def add_float_pair(builder, source: str, pair, tensor: str, output: str | None) -> str:
    """The nodes of one float-grid pair after ``source``; returns the name of the result."""
    fmt = pair.float_format
    last = output if output is not None else builder.unique(f"{tensor}_dequantized")
    if _is_float8(fmt):
        scale = builder.constant(f"{tensor}_scale", pair.scale)
        zero = _float8_constant(builder, f"{tensor}_zero_point", encode_format(pair.zero_point, fmt), fmt)
        axis = {} if pair.axis is None else {"axis": int(pair.axis)}
        quantized = builder.unique(f"{tensor}_quantized")
        builder.nodes.append(helper.make_node("QuantizeLinear", [source, scale, zero], [quantized],
                                              name=builder.unique(f"{tensor}_QuantizeLinear"), **axis))
        builder.nodes.append(helper.make_node("DequantizeLinear", [quantized, scale, zero], [last],
                                              name=builder.unique(f"{tensor}_DequantizeLinear"), **axis))
        return last
    unit = bool(np.all(pair.scale == 1))
    if not unit:
        scale = builder.constant(f"{tensor}_scale", pair.scale.reshape(()))
        divided = builder.unique(f"{tensor}_unscaled")
        builder.nodes.append(helper.make_node("Div", [source, scale], [divided], name=builder.unique(f"{tensor}_Div")))
        source = divided
    narrow = builder.unique(f"{tensor}_{fmt.name.lower()}")
    builder.nodes.append(helper.make_node("Cast", [source], [narrow], to=fmt.onnx_type,
                                          name=builder.unique(f"{tensor}_Cast_{fmt.name.lower()}")))
    wide = last if unit else builder.unique(f"{tensor}_cast_back")
    builder.nodes.append(helper.make_node("Cast", [narrow], [wide], to=TensorProto.FLOAT,
                                          name=builder.unique(f"{tensor}_Cast_float")))
    if not unit:
        builder.nodes.append(helper.make_node("Mul", [wide, scale], [last], name=builder.unique(f"{tensor}_Mul")))
    return last


def float_parameter(builder, config, variable, value: np.ndarray, simulated: np.ndarray, who: str,
                    resolved: tuple) -> str | None:
    """The name an op reads for a parameter on a float grid: its codes in the format's type, dequantized
    (``resolved``: the config's (scale, offset, axis) as the simulation uses them)."""
    fmt = config.float_format
    if value.dtype != np.float32:
        return builder.float_parameter(variable, simulated.astype(value.dtype, copy=False))
    q = config.quantize(value)
    if not np.array_equal(config.dequantize(q), simulated, equal_nan=True):
        builder.notes.append(f"{who}: its simulated value is not on its {fmt.name} grid; written as float")
        return builder.float_parameter(variable, simulated.astype(value.dtype, copy=False))
    scale, _, axis = resolved
    codes = encode_format(q, fmt)
    base = variable.name
    q_name = _float8_constant(builder, f"{base}_{fmt.name.lower()}", codes, fmt)
    key = ("float-dq", q_name, scale.tobytes(), axis)
    output = builder.initializer_keys.get(key)
    if output is not None:
        return output
    output = builder.initializer_keys[key] = builder.unique(f"{base}_dequantized")
    if _is_float8(fmt):
        s_name = builder.constant(f"{base}_scale", scale)
        zero = np.zeros(scale.shape, np.float32)
        z_name = _float8_constant(builder, f"{base}_zero_point", encode_format(zero, fmt), fmt)
        builder.nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [output],
                                              name=builder.unique(f"{base}_DequantizeLinear"),
                                              **({} if axis is None else {"axis": int(axis)})))
    else:
        if np.any(scale != 1):
            raise ExportError(f"{who}: a {fmt.name} parameter with a scale other than 1 has no Cast form")
        builder.nodes.append(helper.make_node("Cast", [q_name], [output], to=TensorProto.FLOAT,
                                              name=builder.unique(f"{base}_Cast_float")))
    builder.counts["quantized_parameters"] += 1
    return output
