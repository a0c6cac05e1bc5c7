"""The pieces of a QDQ export: the parameters of a QuantizeLinear/DequantizeLinear pair, and the builder that
writes pairs, constants and quantized parameters into the node and initializer lists of the model
``ppqlike.export.qdq.build_qdq_model`` assembles."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from onnx import helper, numpy_helper

from ..core.errors import ExportError
from ..core.ir import Graph, Operation, Variable
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked
from ..executor.simulation import apply_config
from .qdq_blocks import block_dequantize_node
from ..core.quant_block import is_block_config
from .qdq_float import add_float_pair, float_pair, float_parameter
from .common import storage_type

S = QuantizationStates

#: The default-domain opset of exported models (per-channel DequantizeLinear needs 13); 16-bit needs 21.
QDQ_OPSET = 13
WIDE_OPSET = 21
#: Parameter slots written as float values (already on the grid) rather than integers + DequantizeLinear.
FLOAT_PARAMETER_SLOTS = {"Clip": (1, 2), "Pad": (2,)}


@dataclass
class QdqPair:
    """The parameters of one QuantizeLinear/DequantizeLinear pair."""

    scale: np.ndarray          # float32, 0-d or 1-D
    zero_point: np.ndarray     # storage dtype, same shape
    axis: int | None
    clip: tuple | None         # (low, high) float32 when the range is narrower than the type
    float_format: object = None  # a FloatFormat (core.float_formats): an FP8 pair or an FP16/BF16 Cast pair


@dataclass
class QdqBuilder:
    graph: Graph
    per_consumer: bool
    uint8: bool
    names: set
    uint8_weights: bool = False
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    initializer_keys: dict = field(default_factory=dict)
    counts: dict = field(default_factory=lambda: {"activation_pairs": 0, "quantized_parameters": 0,
                                                  "float_parameters": 0, "clips": 0, "uint8_converted": 0,
                                                  "uint8_weights": 0})
    opset_needed: int = QDQ_OPSET
    int8_pairs: int = 0
    notes: list = field(default_factory=list)

    def unique(self, base: str) -> str:
        base = base or "t"
        name, index = base, 1
        while name in self.names:
            name, index = f"{base}_{index}", index + 1
        self.names.add(name)
        return name

    def constant(self, base: str, array: np.ndarray) -> str:
        """An initializer holding ``array`` (shared with an identical one made before)."""
        array = np.array(array, order="C")  # (ascontiguousarray would turn 0-d into 1-D)
        key = (base, array.dtype.str, array.shape, hashlib.sha1(array.tobytes()).hexdigest())
        name = self.initializer_keys.get(key)
        if name is None:
            name = self.initializer_keys[key] = self.unique(base)
            self.initializers.append(numpy_helper.from_array(array, name))
        return name

    # ------------------------------------------------------------ activations
    def pair_of(self, config: TensorQuantizationConfig, who: str) -> QdqPair:
        scale, offset, axis = resolved_parameters(config)
        if scale is None:
            raise ExportError(f"{who}: config {config!r} is {config.state.name} but has no scale")
        if config.float_format is not None:
            return QdqPair(*float_pair(config.float_format, scale, axis, who))
        qmin, qmax = config.quant_min, config.quant_max
        kind = storage_type(qmin, qmax, who=who)
        if self.uint8 and kind.numpy == np.int8 and (qmin, qmax) == (-128, 127) and not np.any(offset):
            kind, offset, qmin, qmax = storage_type(0, 255), offset + 128, 0, 255
            self.counts["uint8_converted"] += 1
        self.opset_needed = max(self.opset_needed, kind.opset)
        self.int8_pairs += int(kind.numpy == np.int8)
        clip = None
        if (qmin, qmax) != (kind.low, kind.high):
            low = (np.float32(qmin - offset) * scale).astype(np.float32)
            high = (np.float32(qmax - offset) * scale).astype(np.float32)
            if scale.ndim:
                raise ExportError(f"{who}: a per-channel activation range [{qmin}, {qmax}] narrower than "
                                  f"{kind.name} cannot be exported exactly")
            clip = (low, high)
        return QdqPair(np.asarray(scale, np.float32), offset.astype(kind.numpy), axis, clip)

    def add_pair(self, source: str, pair: QdqPair, tensor: str, output: str | None = None) -> str:
        """Q → DQ (→ Clip) after the tensor named ``source``; returns the name of the result."""
        if pair.float_format is not None:
            self.counts["activation_pairs"] += 1
            return add_float_pair(self, source, pair, tensor, output)
        scale = self.constant(f"{tensor}_scale", pair.scale)
        zero = self.constant(f"{tensor}_zero_point", pair.zero_point)
        axis = {} if pair.axis is None else {"axis": int(pair.axis)}
        quantized = self.unique(f"{tensor}_quantized")
        last = output if output is not None and pair.clip is None else self.unique(f"{tensor}_dequantized")
        self.nodes.append(helper.make_node("QuantizeLinear", [source, scale, zero], [quantized],
                                           name=self.unique(f"{tensor}_QuantizeLinear"), **axis))
        self.nodes.append(helper.make_node("DequantizeLinear", [quantized, scale, zero], [last],
                                           name=self.unique(f"{tensor}_DequantizeLinear"), **axis))
        if pair.clip is not None:
            low, high = (self.constant(f"{tensor}_clip_{n}", v) for n, v in zip(("min", "max"), pair.clip))
            clipped = output if output is not None else self.unique(f"{tensor}_clipped")
            self.nodes.append(helper.make_node("Clip", [last, low, high], [clipped],
                                               name=self.unique(f"{tensor}_Clip")))
            self.counts["clips"] += 1
            last = clipped
        self.counts["activation_pairs"] += 1
        return last

    # ------------------------------------------------------------- parameters
    def parameter(self, operation: Operation, slot: int, variable: Variable,
                  config: TensorQuantizationConfig | None) -> str | None:
        """The name the op reads for a parameter input (None: the raw initializer)."""
        if config is None or not (is_applied(config.state) or is_baked(config.state)):
            return None
        if is_block_config(config):   # weight-only blocks: opset-21 blocked DequantizeLinear
            return block_dequantize_node(self, config, variable.name)
        value = np.asarray(variable.value)
        simulated = np.asarray(apply_config(config, value))
        who = f"parameter {variable.name!r} of {operation.type} {operation.name!r} (slot {slot})"
        if simulated is value:  # baked without a baked value: the executor reads the float original
            return None
        if slot in FLOAT_PARAMETER_SLOTS.get(operation.type, ()) or not np.issubdtype(value.dtype, np.floating):
            return self.float_parameter(variable, simulated.astype(value.dtype, copy=False))
        if config.float_format is not None:
            return float_parameter(self, config, variable, value, simulated, who, resolved_parameters(config))
        integers = self.integers(config, value, simulated)
        if integers is None:
            self.notes.append(f"{who}: its simulated value is not on its config's grid; written as float")
            return self.float_parameter(variable, simulated.astype(value.dtype, copy=False))
        kind = storage_type(config.quant_min, config.quant_max, allow_int32=True, who=who)
        scale, offset, channel_axis = resolved_parameters(config)
        if self.uint8_weights and kind.numpy == np.int8:
            # the same values on the uint8 grid shifted by 128: onnxruntime then runs its u8 x u8 kernels,
            # exact on every CPU (its u8 x s8 kernels saturate pair sums on x86 without VNNI)
            integers, offset = integers.astype(np.int64) + 128, np.asarray(offset, np.int64) + 128
            kind = storage_type(0, 255)
            self.counts["uint8_weights"] += 1
        self.opset_needed = max(self.opset_needed, kind.opset)
        axis = {} if channel_axis is None else {"axis": int(channel_axis)}
        base = variable.name
        q_name = self.constant(f"{base}_quantized", integers.astype(kind.numpy))
        s_name = self.constant(f"{base}_scale", scale)
        z_name = self.constant(f"{base}_zero_point", np.asarray(offset).astype(kind.numpy))
        key = ("dq", q_name, s_name, z_name, axis.get("axis"))
        output = self.initializer_keys.get(key)
        if output is None:
            output = self.initializer_keys[key] = self.unique(f"{base}_dequantized")
            self.nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [output],
                                               name=self.unique(f"{base}_DequantizeLinear"), **axis))
            self.counts["quantized_parameters"] += 1
        return output

    @staticmethod
    def integers(config: TensorQuantizationConfig, value: np.ndarray, simulated: np.ndarray) -> np.ndarray | None:
        """Integers whose DequantizeLinear equals ``simulated`` bit for bit (None if there are none)."""
        for candidate in (value, simulated):
            q = config.quantize(candidate)
            if np.array_equal(config.dequantize(q), simulated):
                return q
        return None

    def float_parameter(self, variable: Variable, simulated: np.ndarray) -> str | None:
        if np.array_equal(simulated, variable.value) and simulated.dtype == variable.value.dtype:
            return None
        self.counts["float_parameters"] += 1
        return self.constant(f"{variable.name}_baked", simulated)


def resolved_parameters(config: TensorQuantizationConfig) -> tuple:
    """(scale float32, offset int64, axis) as the simulation uses them: a one-element scale
    without a channel axis is per tensor (0-d), as in ``ppqlike.core.numerics``."""
    scale, offset = config.scale, config.offset
    if scale is None:
        return None, None, None
    axis = config.channel_axis if scale.ndim else None
    if scale.ndim and (axis is None or scale.ndim != 1):
        if scale.size != 1:
            raise ExportError(f"config {config!r}: a scale of shape {scale.shape} needs a channel axis")
        scale, axis = scale.reshape(()), None
    offset = np.zeros(scale.shape, np.int64) if offset is None else np.asarray(offset, np.int64)
    if offset.shape != scale.shape:
        offset = np.broadcast_to(offset.reshape(-1)[0] if offset.size == 1 else offset, scale.shape)
    return np.asarray(scale, np.float32), np.asarray(offset, np.int64), axis
