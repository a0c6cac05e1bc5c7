"""Quantization simulation: how the executor applies configs, and the dequantize context.

Which configs are in effect is decided in ``ppqlike.core.quant_graph``; this module runs them.

Per input or output slot of an op with an OperationQuantizationConfig:

* ACTIVATED, SLAVE, PASSIVE: the value is fake-quantized with the config's
  (possibly master's) scale and offset (a SLAVE whose master is still
  INITIAL, during calibration, passes through);
* BAKED, PASSIVE_BAKED: the config's ``baked_value`` replaces the parameter;
* FP32, SOI, DEACTIVATED, DEQUANTIZED, OVERLAPPED, INITIAL, PASSIVE_INIT:
  the value passes through.

Shortcuts that change no value (checked against op-by-op ``run_operation``):
the executor records the grid (``grid_key``) each value was quantized to,
and a reader whose config has the same grid and rounds to nearest gets the
value as it is; results the kernel made for the call (``fresh_results``) are
quantized in place.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..core.subgraphs import all_bodies
from ..core.ir import Graph, Operation
from ..core.layout import memory_axes
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked, is_dequantizable
from ..core.quant_graph import awaits_master, iter_tensor_configs, requantized
from ..core.rounding import NEAREST_POLICIES
from .integer_codes import Codes, values_of
from .integer_requantization import requantize_output
from .ops._threads import parallel_items


def apply_config(config: TensorQuantizationConfig | None, value, in_place: bool = False):
    """The value an op sees through ``config`` (see the module docstring); ``in_place``: ``value`` is
    the executor's own float array and may be overwritten by its fake quantization."""
    if config is None or value is None:
        return value
    state = config.state
    if is_applied(state):
        if awaits_master(config):
            return value
        return config.fake_quantize(value, out=value if in_place else None, map_blocks=parallel_items)
    if is_baked(state) and config.baked_value is not None:
        return config.baked_value
    return value


def passes_through(config: TensorQuantizationConfig | None) -> bool:
    """Whether ``apply_config(config, value)`` gives ``value`` itself back (without computing it)."""
    if config is None:
        return True
    if is_applied(config.state):
        return awaits_master(config)
    return not (is_baked(config.state) and config.baked_value is not None)


def grid_key(config: TensorQuantizationConfig | None) -> tuple | None:
    """What identifies the grid ``config`` puts values on (scale, offset, range, axis), or None when it
    does not quantize them (not applied, or a grid too wide for the idempotence below).

    The executor remembers the key of the config that last quantized each value: a reader whose
    config has the same key and rounds to nearest would give the value back unchanged, since
    fake_quantize(fake_quantize(x)) == fake_quantize(x) bit for bit when |q - z| < 2^21.
    """
    if config is None or not is_applied(config.state) or awaits_master(config):
        return None
    return _grid_of(config)


def requantized_grid(config: TensorQuantizationConfig | None) -> tuple | None:
    """The grid key of the values ``requantize_output`` makes through ``config`` (S * (q - z) with q in
    its range: the values its fake quantization would make), or None where it does not requantize."""
    if not requantized(config, "output"):
        return None
    return _grid_of(config)


def _grid_of(config: TensorQuantizationConfig) -> tuple | None:
    if config.quant_max - config.quant_min >= 1 << 21:
        return None
    scale, offset = np.asarray(config.scale), np.asarray(config.offset)
    axis = config.channel_axis if scale.ndim else None
    fmt = config.float_format
    return (scale.dtype.str, scale.tobytes(), offset.tobytes(), config.quant_min, config.quant_max, axis,
            None if fmt is None else fmt.name)


def keeps_grid(config: TensorQuantizationConfig | None, key: tuple | None) -> bool:
    """Whether quantizing a value that lies on grid ``key`` with ``config`` leaves it unchanged."""
    return key is not None and config is not None and config.rounding in NEAREST_POLICIES and grid_key(config) == key


def argument_grids(operation: Operation, names: tuple, grids: dict) -> tuple:
    """Per input of ``operation`` (after its input configs ran): the grid key its value lies on, or None.

    An applied input config put the value on its grid (or found it there); otherwise the value is
    what its producer left, on the grid ``grids`` recorded for it, if any.
    """
    configs = operation.config.input_quantization_config if operation.config is not None else ()
    keys = []
    for index, name in enumerate(names):
        key = grid_key(configs[index]) if index < len(configs) else None
        keys.append(key if key is not None else grids.get(name))
    return tuple(keys)


def fresh_results(operation: Operation, results: list, arguments: list) -> tuple:
    """Per result: whether it is a float32 array the kernel made for this call (writeable, sharing no
    memory with any input), which output quantization may then overwrite."""
    if operation.config is None or operation.type == "Constant":
        return ()
    return tuple(isinstance(value, np.ndarray) and value.dtype == np.float32 and value.flags.writeable
                 and memory_axes(value) is not None
                 and not any(isinstance(a, np.ndarray) and np.may_share_memory(value, a) for a in arguments)
                 for value in results)


def apply_output_config(config: TensorQuantizationConfig | None, value, in_place: bool = False):
    """The value an op's output takes through ``config``: integer requantization where configured."""
    if value is not None and requantized(config, "output"):
        return requantize_output(config, value)
    return apply_config(config, value, in_place)


@contextmanager
def dequantized(graph: Graph):
    """Run the graph in float: every dequantizable config (its bodies' too) is DEQUANTIZED inside the block.

    On exit (also through an exception) every config returns exactly to the
    state it had.  Nesting is harmless: configs already DEQUANTIZED are left
    to the outer block.
    """
    switched: list[TensorQuantizationConfig] = []
    seen: set[int] = set()
    graphs = [graph, *all_bodies(graph)]   # the ops inside If/Loop/Scan bodies too
    try:
        for *_, tqc in (entry for each in graphs for entry in iter_tensor_configs(each)):
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


def quantize_inputs(operation: Operation, arguments: list, names: tuple = (), grids: dict | None = None,
                    as_codes: bool = False) -> list:
    """The op's inputs through its input configs; a value whose name ``grids`` records on the grid a
    config would quantize it to is passed as it is (the same array: nothing would change).  ``as_codes``
    (an integer kernel reads them): a float32 value a per-tensor config quantizes comes as ``Codes``."""
    config = operation.config
    if config is None:
        return arguments
    quantized = list(arguments)
    for index, (tqc, value) in enumerate(zip(config.input_quantization_config, arguments)):
        name = names[index] if index < len(names) else None
        if grids and name in grids and keeps_grid(tqc, grids[name]):
            continue
        if as_codes and isinstance(value, np.ndarray) and tqc is not None and is_applied(tqc.state) \
                and not awaits_master(tqc):
            codes = tqc.quantize_codes(value, map_blocks=parallel_items)
            if codes is not None:
                quantized[index] = Codes(codes, tqc)
                continue
        quantized[index] = apply_config(tqc, value)
    return quantized


def quantize_outputs(operation: Operation, results: list, names: tuple = (), grids: dict | None = None,
                     on_output_grid: bool = False, fresh: tuple = ()) -> list:
    """The op's results through its output configs, recording in ``grids`` (by ``names``) the grid each
    quantized one lies on; ``on_output_grid``: the results already lie on their configs' grids (an
    integer kernel put them there, requantized where a config requantizes);
    ``fresh[i]``: result i is the executor's own and is quantized in place."""
    config = operation.config
    if config is None:
        return results
    quantized = list(results)
    for index, (tqc, value) in enumerate(zip(config.output_quantization_config, results)):
        key = grid_key(tqc) if tqc is None or tqc.requantization is None else requantized_grid(tqc)
        if not (on_output_grid and key is not None):
            in_place = index < len(fresh) and fresh[index]
            quantized[index] = apply_output_config(tqc, values_of(value), in_place)
        if grids is not None and index < len(names):
            if key is None:
                grids.pop(names[index], None)
            else:
                grids[names[index]] = key
    return quantized
