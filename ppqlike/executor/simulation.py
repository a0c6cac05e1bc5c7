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

from ..core import numerics
from ..core.ir import Graph, Operation
from ..core.layout import channel_view, dense, empty_like_dense, memory_axes
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked, is_dequantizable
from ..core.quant_graph import awaits_master, iter_tensor_configs, quantizes
from ..core.rounding import RoundingPolicy, round_into
from .integer_codes import Codes, channel_chunks, values_of
from .ops._threads import parallel_items

_REQUANTIZE_OUTPUT_BLOCK = 1 << 17   # elements per chunk of requantize_output: its ~11 passes each a numpy call,
                                     # so chunks large enough that two threads seldom wait for the GIL

#: policies under which fake-quantizing a value already on the grid gives it back unchanged
#: (x / S lies within a few ulps of an integer, and these round that to the integer)
_NEAREST = frozenset({RoundingPolicy.ROUND_HALF_EVEN, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
                      RoundingPolicy.ROUND_HALF_TOWARDS_ZERO, RoundingPolicy.ROUND_HALF_UP,
                      RoundingPolicy.ROUND_HALF_DOWN})


def apply_config(config: TensorQuantizationConfig | None, value, in_place: bool = False):
    """The value an op sees through ``config`` (see the module docstring); ``in_place``: ``value`` is
    the executor's own float array and may be overwritten by its fake quantization."""
    if config is None or value is None:
        return value
    state = config.state
    if is_applied(state):
        if awaits_master(config):
            return value
        return config.fake_quantize(value, out=value if in_place else None)
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
    if config is None or config.requantization is None or not quantizes(config, "output"):
        return None
    return _grid_of(config)


def _grid_of(config: TensorQuantizationConfig) -> tuple | None:
    if config.quant_max - config.quant_min >= 1 << 21:
        return None
    scale, offset = np.asarray(config.scale), np.asarray(config.offset)
    axis = config.channel_axis if scale.ndim else None
    return scale.dtype.str, scale.tobytes(), offset.tobytes(), config.quant_min, config.quant_max, axis


def keeps_grid(config: TensorQuantizationConfig | None, key: tuple | None) -> bool:
    """Whether quantizing a value that lies on grid ``key`` with ``config`` leaves it unchanged."""
    return key is not None and config is not None and config.rounding in _NEAREST and grid_key(config) == key


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


def requantize_output(config: TensorQuantizationConfig, value):
    """Integer requantization of a computing op's output (``config.requantization``, TPU style).

    The float output y is turned back into its int32 accumulator
    acc = round(y / S_acc) (exact up to float error), requantized with the
    stored integer multiplier and right shift under the config's rounding,
    and dequantized with the output scale.  Elementwise, so it runs a
    cache-sized block at a time (whole channels' slices of the per-channel
    factors with each), the blocks on the kernel threads, each with float64
    buffers of its own.
    """
    facts = config.requantization
    axis = facts.channel_axis % value.ndim
    per_channel = facts.per_channel
    accumulator_scale = np.asarray(facts.accumulator_scale, np.float64).reshape(-1)
    multiplier, shift = np.asarray(facts.multiplier).reshape(-1), np.asarray(facts.right_shift).reshape(-1)
    value = dense(value)
    result = empty_like_dense(value, np.float32)
    source = channel_view(value, axis if per_channel else None)   # the factors along its middle axis
    out = channel_view(result, axis if per_channel else None)
    chunks = list(channel_chunks(source.shape, _REQUANTIZE_OUTPUT_BLOCK))
    largest = max((source[rows, channels].size for rows, channels in chunks), default=0)

    def requantize_chunk(index, buffers):   # elementwise: the chunks on the kernel threads
        rows, channel_range = chunks[index]
        block = source[rows, channel_range]
        if per_channel:
            factors = accumulator_scale[channel_range].reshape(1, -1, 1)
            m, r = multiplier[channel_range], shift[channel_range]
        else:
            factors, m, r = accumulator_scale[0], int(multiplier[0]), int(shift[0])
        acc, scratch = (b[:block.size].reshape(block.shape) for b in buffers)
        np.divide(block, factors, out=acc, dtype=np.float64)
        np.rint(acc, out=acc)
        _requantize_block(acc, scratch, m, r, config, per_channel, out[rows, channel_range])
    parallel_items(requantize_chunk, len(chunks), lambda: (np.empty(largest), np.empty(largest)))
    return result


def _requantize_block(acc: np.ndarray, scratch: np.ndarray, multiplier, shift, config: TensorQuantizationConfig,
                      per_channel: bool, target: np.ndarray) -> None:
    """One block of ``requantize_output``: the integer accumulator ``acc`` (float64 integers, overwritten;
    ``scratch`` a float64 buffer of its shape) to output values, written into ``target`` (float32).

    t = acc * (M0 * 2^-shift) in float64 rounds under the config's policy to the integer of the int64
    multiply and rounding right shift when
    * shift + bits(L) <= 53, L = max(|qmin - z|, |qmax - z|) + 1: where |t| < L its rounding error is
      below half an ulp of L, under the 2^-shift that parts a multiple of 2^-shift from any other half
      integer, so no decision moves; where |t| >= L the clamp decides either way (rounding is monotone);
    * or max|acc| * max M0 < 2^53 (two more passes to find): then t is exact.
    Otherwise the int64 path.  Where no t with |t| < L is a tie (``IntegerRequantization.ties_possible``:
    any multiplier whose odd part is 2L or more) a nearest policy is rint alone, and outside that range
    the clamp decides.  The values S * (q - z): the float64 product of the integer (below 2^24)
    and the float32 S is exact, so its float32 rounding is dequantize's float32 product.
    """
    offset = int(config.offset)
    reach = max(abs(config.quant_min - offset), abs(config.quant_max - offset)) + 1
    scale = np.asarray(config.scale)
    exact = int(np.max(shift)) + reach.bit_length() <= 53
    if not exact:   # two passes more: max|acc| * max M0 < 2^53 makes t exact
        largest = max(float(acc.max(initial=0.0)), -float(acc.min(initial=0.0)))
        exact = largest * float(np.max(np.abs(multiplier))) < 2.0 ** 53
    if not exact or scale.dtype != np.float32 or scale.size != 1:
        q = numerics.requantize(acc.astype(np.int64), multiplier, shift, offset, config.quant_min, config.quant_max,
                                config.rounding, channel_axis=1 if per_channel else None)
        target[...] = numerics.dequantize(q, config.scale, config.offset)
        return
    ratio = np.ldexp(np.asarray(multiplier, np.float64), -np.asarray(shift, np.int64))
    t = np.multiply(acc, ratio.reshape(1, -1, 1) if per_channel else ratio, out=acc)
    if config.rounding in _NEAREST and not config.requantization.ties_possible(reach):
        rounded = np.rint(t, out=scratch)   # no t in range is a tie: every nearest policy is rint
    else:
        rounded = round_into(t, scratch, config.rounding)   # t: its scratch
    step = np.float64(scale.reshape(()))
    with np.errstate(over="ignore"):   # codes far out of range: inf, which the clamp below takes to its edge
        np.multiply(rounded, step, out=target, casting="same_kind")
    # the clamp of q into range on the values, in float32 (S * code is monotone in the code, and the edges
    # are the products S * (qmin - z), S * (qmax - z) rounded as the values are)
    np.clip(target, np.float32((config.quant_min - offset) * step), np.float32((config.quant_max - offset) * step),
            out=target)


def apply_output_config(config: TensorQuantizationConfig | None, value, in_place: bool = False):
    """The value an op's output takes through ``config``: integer requantization where configured."""
    if value is not None and config is not None and config.requantization is not None \
            and quantizes(config, "output"):
        return requantize_output(config, value)
    return apply_config(config, value, in_place)


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
            codes = tqc.quantize_codes(value)
            if codes is not None:
                quantized[index] = Codes(codes, tqc)
                continue
        quantized[index] = apply_config(tqc, value)
    return quantized


def quantize_outputs(operation: Operation, results: list, names: tuple = (), grids: dict | None = None,
                     on_output_grid: bool = False, fresh: tuple = ()) -> list:
    """The op's results through its output configs, recording in ``grids`` (by ``names``) the grid each
    quantized one lies on; ``on_output_grid``: the results already lie on their configs' grids;
    ``fresh[i]``: result i is the executor's own and is quantized in place."""
    config = operation.config
    if config is None:
        return results
    quantized = list(results)
    for index, (tqc, value) in enumerate(zip(config.output_quantization_config, results)):
        key = grid_key(tqc) if tqc is None or tqc.requantization is None else requantized_grid(tqc)
        if not (on_output_grid and key is not None and tqc.requantization is None):
            in_place = index < len(fresh) and fresh[index]
            quantized[index] = apply_output_config(tqc, values_of(value), in_place)
        if grids is not None and index < len(names):
            if key is None:
                grids.pop(names[index], None)
            else:
                grids[names[index]] = key
    return quantized
