"""Quantization simulation: which configs the executor applies, and the dequantize context.

Per input or output slot of an op with an OperationQuantizationConfig:

* ACTIVATED, SLAVE, PASSIVE: the value is fake-quantized with the config's
  (possibly master's) scale and offset (a SLAVE whose master is still
  INITIAL, during calibration, passes through);
* BAKED, PASSIVE_BAKED: the config's ``baked_value`` replaces the parameter;
* FP32, SOI, DEACTIVATED, DEQUANTIZED, OVERLAPPED, INITIAL, PASSIVE_INIT:
  the value passes through.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..core.ir import Graph, Operation, Variable
from ..core.quant import (QuantizationStates, TensorQuantizationConfig, is_applied, is_baked,
                          is_dequantizable)


def awaits_master(config: TensorQuantizationConfig) -> bool:
    """A SLAVE whose master is not calibrated yet (during calibration): it has nothing to apply."""
    return config.state is QuantizationStates.SLAVE and config.master.state is QuantizationStates.INITIAL


def overlapped_root(config: TensorQuantizationConfig) -> TensorQuantizationConfig:
    """The end of ``config``'s chain of OVERLAPPED masters (``config`` itself when not OVERLAPPED)."""
    while config.state is QuantizationStates.OVERLAPPED and config.master is not None:
        config = config.master
    return config


def apply_config(config: TensorQuantizationConfig | None, value):
    """The value an op sees through ``config`` (see the module docstring)."""
    if config is None or value is None:
        return value
    state = config.state
    if is_applied(state):
        if awaits_master(config):
            return value
        return config.fake_quantize(value)
    if is_baked(state) and config.baked_value is not None:
        return config.baked_value
    return value


def requantize_output(config: TensorQuantizationConfig, value):
    """Integer requantization of a computing op's output (``detail['requantization']``, TPU style).

    The float output y is turned back into its int32 accumulator
    acc = round(y / S_acc) (exact up to float error), requantized with the
    stored integer multiplier and right shift under the config's rounding,
    and dequantized with the output scale.
    """
    import numpy as np

    from ..core import numerics

    facts = config.detail["requantization"]
    axis = facts["channel_axis"] % value.ndim
    accumulator_scale = np.asarray(facts["accumulator_scale"], np.float64)
    per_channel = accumulator_scale.size > 1
    acc = np.rint(value.astype(np.float64) / numerics.along_channel_axis(
        accumulator_scale, value.ndim, value.shape, axis if per_channel else None)).astype(np.int64)
    multiplier, shift = np.asarray(facts["multiplier"]), np.asarray(facts["right_shift"])
    q = numerics.requantize(acc, multiplier if per_channel else int(multiplier[0]),
                            shift if per_channel else int(shift[0]), int(config.offset),
                            config.quant_min, config.quant_max, config.rounding,
                            channel_axis=axis if per_channel else None)
    return numerics.dequantize(q, config.scale, config.offset)


def quantizes(config: TensorQuantizationConfig | None, side: str) -> bool:
    """Whether the executor quantizes an activation through ``config`` at run time.

    Applied states do; so does an output config carrying an integer
    requantization (TPU style) while it is OVERLAPPED by a master that is
    itself applied (not while the graph runs dequantized).  Exporters use this
    same rule, so the exported model quantizes exactly where the simulation does.
    """
    if config is None:
        return False
    if is_applied(config.state):
        return True
    if side != "output" or config.state is not QuantizationStates.OVERLAPPED or "requantization" not in config.detail:
        return False
    return is_applied(overlapped_root(config).state)


def apply_output_config(config: TensorQuantizationConfig | None, value):
    """The value an op's output takes through ``config``: integer requantization where configured."""
    if value is not None and "requantization" in getattr(config, "detail", ()) and quantizes(config, "output"):
        return requantize_output(config, value)
    return apply_config(config, value)


def iter_tensor_configs(graph: Graph) -> Iterator[tuple[Operation, str, int, Variable, TensorQuantizationConfig]]:
    """Every (op, 'input'|'output', slot, variable, config) of the graph's quantized ops."""
    for operation in graph.operations.values():
        config = operation.config
        if config is None:
            continue
        for index, tqc in enumerate(config.input_quantization_config):
            if tqc is not None and index < len(operation.inputs):
                yield operation, "input", index, operation.inputs[index], tqc
        for index, tqc in enumerate(config.output_quantization_config):
            if tqc is not None and index < len(operation.outputs):
                yield operation, "output", index, operation.outputs[index], tqc


@contextmanager
def dequantized(graph: Graph):
    """Run the graph in float: every dequantizable config is DEQUANTIZED inside the block.

    On exit (also through an exception) every config returns exactly to the
    state it had.  Nesting is harmless: configs already DEQUANTIZED are left
    to the outer block.
    """
    switched: list[TensorQuantizationConfig] = []
    seen: set[int] = set()
    try:
        for *_, tqc in iter_tensor_configs(graph):
            if id(tqc) in seen:
                continue
            seen.add(id(tqc))
            if is_dequantizable(tqc.state):
                tqc.set_dequantized()
                switched.append(tqc)
        yield graph
    finally:
        for tqc in reversed(switched):
            if tqc.state is QuantizationStates.DEQUANTIZED:
                tqc.restore()
