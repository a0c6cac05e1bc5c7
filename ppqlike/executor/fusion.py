"""Work the NumpyExecutor skips or merges when nothing observable changes.

Decided once per plan: which Relu/Clip runs in place on its producer's result
(``activation_partners``), and which Pads their Convs do instead
(``pad_folds``).  At run time: whether the configs of a pair let it fuse,
the activation's bounds (a Conv kernel clips its blocks with them while they
are in cache) and the in-place activation itself.  Hooks see every op: with
hooks the executor fuses nothing.  Reads configs; writes only the arrays the
executor made for the call.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Operation
from ..core.op_facts import COMPUTING_TYPES, FUSABLE_ACTIVATIONS, VALUE_PRESERVING_TYPES
from ..core.quant import is_applied
from ..core.quant_graph import input_config, output_config, overlapped_root, quantizes, requantized
from .integer_codes import Codes
from .ops._prepared import prepared
from .requantizing_kernels import wants_integer_kernel, wants_requantizing_kernel
from .simulation import (argument_grids, grid_key, keeps_grid, passes_through, quantize_inputs, quantize_outputs,
                         requantized_grid)


def activation_partners(order: list, keep: set) -> dict:
    """Step index of a computing op -> step index of the Relu/Clip that is its result's only reader."""
    position = {op.name: i for i, op in enumerate(order)}
    partners = {}
    for index, operation in enumerate(order):
        if operation.type not in COMPUTING_TYPES or len(operation.outputs) != 1:
            continue
        output = operation.outputs[0]
        readers = output.consumers
        if len(readers) == 1 and readers[0].type in FUSABLE_ACTIVATIONS and output.name not in keep \
                and readers[0].inputs[0] is output and readers[0].name in position:
            partners[index] = position[readers[0].name]
    return partners


def expand_chains(order: list, keep: set, partners: dict, folds: frozenset = frozenset()) -> dict:
    """Step index of a 1x1 Conv -> (its Relu/Clip's index or None, the index of a Pad of ``folds``
    between or None, the index of the depthwise Conv that alone reads its result, that Conv's
    Relu/Clip's index or None): MobileNet-style expansions, which the executor may run as one kernel
    (``chains``) so that the expanded activation never goes to memory whole.  Both Convs run
    as integer kernels or neither does; whether the configs let a chain run as one kernel
    is decided when it runs."""
    position = {op.name: i for i, op in enumerate(order)}
    chains = {}
    for index, first in enumerate(order):
        integer = wants_integer_kernel(first)
        weight = _pointwise_weight(first, integer)
        if weight is None:
            continue
        activation = partners.get(index)
        middle = order[activation].outputs[0] if activation is not None else first.outputs[0]
        readers = middle.consumers
        if middle.name in keep or first.outputs[0].name in keep or len(readers) != 1:
            continue
        pad = None
        if readers[0].name in position and position[readers[0].name] in folds:   # EfficientNet's explicit Pad
            pad = position[readers[0].name]
            middle = readers[0].outputs[0]
            readers = middle.consumers
            if len(readers) != 1:
                continue
        second = readers[0]
        filters = _conv_weight(second, integer)
        if filters is None or second.inputs[0] is not middle or any(v is middle for v in second.inputs[1:]) \
                or second.name not in position or filters.shape[:2] != (weight.shape[0], 1) \
                or int(second.attributes.get("group", 1)) != weight.shape[0]:
            continue
        last = partners.get(position[second.name])
        chains[index] = (activation, pad, position[second.name], last)
    return chains


def chain_projections(order: list, keep: set, chains: dict, partners: dict) -> dict:
    """Step index of a chain's 1x1 Conv -> (the step index of the 1x1 Conv (stride 1, no pads, one group,
    run as integer kernels as the chain's Convs are) that alone reads the chain's result -
    MobileNet's projection -, that Conv's Relu/Clip's index or None), for the chains that have one: a float
    chain may then run it too, its input never going to memory whole."""
    position = {op.name: i for i, op in enumerate(order)}
    projections = {}
    for index, (_, _, second, last) in chains.items():
        result = order[second if last is None else last].outputs[0]
        readers = result.consumers
        if result.name in keep or len(readers) != 1 or readers[0].name not in position:
            continue
        third = readers[0]
        if _pointwise_weight(third, wants_integer_kernel(order[index])) is None or third.inputs[0] is not result \
                or any(v is result for v in third.inputs[1:]):
            continue
        projections[index] = (position[third.name], partners.get(position[third.name]))
    return projections


def _pointwise_weight(operation: Operation, integer: bool = False):
    """``_conv_weight`` of a 1x1 Conv with stride 1, no pads and one group, or None."""
    weight = _conv_weight(operation, integer)
    if weight is None or weight.shape[2:] != (1, 1) or int(operation.attributes.get("group", 1)) != 1 \
            or any(int(v) != 1 for v in operation.attributes.get("strides", [1, 1])) \
            or any(int(v) != 0 for v in operation.attributes.get("pads", [0, 0, 0, 0])):
        return None
    return weight


def _conv_weight(operation: Operation, integer: bool = False):
    """The 4-D weight of a 2-D Conv with explicit pads and parameter weight and bias, marked for
    integer kernels (``requantizing_kernels.wants_integer_kernel``) or not as ``integer`` says, or None."""
    if operation.type != "Conv" or wants_integer_kernel(operation) != integer or len(operation.outputs) != 1 \
            or operation.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") \
            or len(operation.inputs) < 2 or operation.inputs[1] is None or not operation.inputs[1].is_parameter:
        return None
    if len(operation.inputs) > 2 and operation.inputs[2] is not None and not operation.inputs[2].is_parameter:
        return None
    weight = operation.inputs[1].value
    return weight if weight is not None and np.ndim(weight) == 4 else None


def pad_folds(order: list, keep: set, opset: int) -> frozenset:
    """Step indices of the constant Pads read only by unquantized Convs (as their data, with explicit
    pads): when such a Pad turns out at run time to pad with zeros on spatial axes only
    (``ops.tensor.zero_spatial_pads``), its Convs pad instead (EfficientNet's exports pad before every
    "same" convolution: a copy of each input)."""
    if opset < 11:
        return frozenset()
    folds = set()
    for index, operation in enumerate(order):
        if operation.type != "Pad" or operation.domain not in ("", "ai.onnx") or operation.config is not None \
                or operation.attributes.get("mode", "constant") not in ("constant", b"constant"):
            continue
        output = operation.outputs[0]
        readers = output.consumers
        if output.name in keep or not readers or any(
                r.type != "Conv" or r.config is not None or r.inputs[0] is not output
                or any(v is output for v in r.inputs[1:])
                or r.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID")
                for r in readers):
            continue
        folds.add(index)
    return frozenset(folds)


def configs_let_fuse(producer: Operation, activation: Operation) -> bool:
    """Whether no quantization stands between ``producer``'s result and ``activation``'s input (an
    OVERLAPPED output config carrying an integer requantization does quantize: ``quantizes``)."""
    output = output_config(producer)
    return passes_through(output) and not quantizes(output, "output") and passes_through(input_config(activation, 0))


def requantizes_onto(producer: Operation, activation: Operation) -> bool:
    """Whether ``producer``'s integer requantization puts its result on the grid of the config that quantizes
    its Relu/Clip ``activation``'s input (their roots agree), nothing between: the requantizing kernel may
    then clamp to the activation's ``grid_edges`` and do both."""
    if not (wants_requantizing_kernel(producer) and passes_through(input_config(activation, 0))):
        return False
    output = output_config(producer)
    key = requantized_grid(output)
    return key is not None and key == grid_key(overlapped_root(output))


def fusable(producer: Operation, activation: Operation, value) -> bool:
    """Whether running ``activation`` in place on ``producer``'s raw result ``value`` changes nothing observable."""
    if producer.type in ("Gemm", "MatMul") and not value.flags.owndata:
        return False
    if not isinstance(value, np.ndarray) or not value.flags.writeable or value.dtype.kind != "f":
        return False
    return configs_let_fuse(producer, activation)


def activation_bounds(activation: Operation, bound_inputs: list, opset: int) -> tuple | None:
    """(low, high) of a Relu/Clip (None for an absent bound): Clip's ``bound_inputs`` (its inputs after the
    first) through its input configs, or its attributes before opset 11; None when it bounds nothing."""
    if activation.type == "Relu":
        return 0.0, None
    arguments = quantize_inputs(activation, [None] + list(bound_inputs))
    low = None if len(arguments) < 2 or arguments[1] is None else arguments[1]
    high = None if len(arguments) < 3 or arguments[2] is None else arguments[2]
    if opset < 11:
        low, high = activation.attributes.get("min"), activation.attributes.get("max")
    return None if low is None and high is None else (low, high)


def grid_edges(activation: Operation, bounds: tuple | None, lies_on: tuple | None) -> np.ndarray | None:
    """[low, high] of a Relu/Clip of ``bounds`` quantized by its output config, when that config
    quantizes to the grid ``lies_on`` (the key of the grid its input lies on, unclamped; None: none).

    quantize(clip(v, lo, hi)) equals clip(v, quantize(lo), quantize(hi)) for every v on that grid
    (quantization is monotone and leaves grid points in range unchanged), so one clip to these edges
    does both; None when that does not hold.
    """
    output = output_config(activation)
    low, high = (None, None) if bounds is None else bounds
    if lies_on is None or output is None or output.requantization is not None \
            or not keeps_grid(output, lies_on) or np.size(low) > 1 or np.size(high) > 1:
        return None
    bounds = np.array([-np.inf if low is None else np.asarray(low).reshape(-1)[0],
                       np.inf if high is None else np.asarray(high).reshape(-1)[0]], np.float32)
    return prepared(lambda: output.fake_quantize(bounds), ("grid edges", lies_on, output.rounding, bounds.tobytes()),
                    ())   # by content (the grid and the bounds' bits): the same every forward


def activate_in_place(activation: Operation, output_names: tuple, value: np.ndarray, bounds: tuple | None,
                      grids: dict, lies_on: tuple | None = None, clipped: bool = False,
                      on_edges: bool = False) -> list:
    """Apply a Relu/Clip of ``bounds`` (``activation_bounds``) to ``value`` in place (``clipped``: the
    producer's kernel did), then the activation's output quantization.

    ``lies_on``: the grid key ``value`` lies on, unclamped (an integer kernel put it there): then one
    clip to ``grid_edges`` does both, or nothing when the integer kernel already clamped to them
    (``on_edges``).
    """
    edges = grid_edges(activation, None if clipped else bounds, lies_on)
    if edges is not None:
        if not on_edges:
            np.clip(value, edges[0], edges[1], out=value)
        grids[output_names[0]] = lies_on
        return [value]
    clip = None if clipped else clip_epilogue(bounds)
    if clip is not None:
        clip(value)
    return quantize_outputs(activation, [value], output_names, grids, fresh=(True,))


def quantizing_epilogue(producer: Operation, activation: Operation | None, bounds: tuple | None):
    """(the work on each block of a float kernel's result - the clip of a fused Relu/Clip ``activation`` of
    ``bounds``, then the per-tensor fake quantization of the output config after it -, the grid key the
    block ends on or None), or None when the configs ask for more (a quantization between the producer and
    its activation, a requantization, a per-channel output).  The epilogue takes ``(block, out=None)`` as
    ``clip_epilogue``'s does; elementwise, so its blocks give the whole tensor's values bit for bit."""
    clip = None
    if activation is not None:
        if not configs_let_fuse(producer, activation):
            return None
        clip = clip_epilogue(bounds)
    config = output_config(activation if activation is not None else producer)
    if requantized(config, "output"):
        return None   # (an applied config carrying a requantization among them)
    if passes_through(config):
        return clip, None
    if not is_applied(config.state) or np.size(config.scale) != 1:
        return None

    low, high = (None, None) if clip is None else bounds
    quantizer = config.fake_quantizer(low, high, clipped=clip is not None)   # resolved once, run per block

    def quantize(block: np.ndarray, out: np.ndarray | None = None) -> None:
        quantizer(block, block if out is None else out)
    return quantize, grid_key(config)


def activate_on_grid(activation: Operation, output_names: tuple, value, lies_on: tuple | None, bounds: tuple | None,
                     grids: dict) -> list | None:
    """A Relu/Clip of ``bounds`` whose input ``value`` (its producer's fresh result, read by nothing else)
    lies on grid ``lies_on`` that its output config keeps (a TPU-style requantized output): one clip in
    place to ``grid_edges`` does the activation and its output quantization (``activate_in_place``);
    None (nothing done) when that does not apply."""
    if lies_on is None or not passes_through(input_config(activation, 0)) \
            or not (isinstance(value, np.ndarray) and value.dtype == np.float32 and value.flags.writeable) \
            or grid_edges(activation, bounds, lies_on) is None:
        return None
    return activate_in_place(activation, output_names, value, bounds, grids, lies_on)


def clip_epilogue(bounds: tuple | None):
    """A conv kernel's work on each block of its result for a fused activation of ``bounds``
    (``activation_bounds``; None: nothing to do): ``epilogue(block, out=None)`` clips ``block`` in place,
    or into ``out`` (the same shape, any layout)."""
    if bounds is None:
        return None
    low = -np.inf if bounds[0] is None else bounds[0]   # numpy's two-bound clip: about 2x maximum's speed
    high = np.inf if bounds[1] is None else bounds[1]
    # ndarray.clip rather than np.clip: two wrapper layers fewer (2 us a call, each block, with the GIL held)
    def clip(block: np.ndarray, out: np.ndarray | None = None) -> None:
        block.clip(low, high, out=block if out is None else out)
    clip.single_pass = True   # writing a strided ``out`` as it reads costs no more than a copy there would
    return clip


#: Ops whose result on integer codes is the codes of their result on the values, on the same grid: they
#: select, move or compare values without arithmetic (a Pad's constant would need its own code); a Concat
#: when its inputs share a grid.
MOVES_CODES = (VALUE_PRESERVING_TYPES - {"Pad"}) | {"Concat"}


def _data_inputs(operation: Operation, names: tuple) -> tuple:
    """The input names of a ``MOVES_CODES`` op whose elements its results hold: all of a Concat's, else the
    first (the others are shapes, indices, axes)."""
    return names if operation.type == "Concat" else names[:1]


def moves_grid(operation: Operation, names: tuple, grids: dict) -> bool:
    """Whether the results of a ``MOVES_CODES`` op lie on its output configs' grids already: its data inputs
    lie (after their input configs, ``argument_grids``) on one per-tensor grid that every output config
    keeps.  Its results are elements of those inputs, so quantizing them again would change no bit (a
    SqueezeNet Concat's output: 15 ms of a 158 ms batch)."""
    config = operation.config
    if config is None or operation.type not in MOVES_CODES:
        return False
    keys = argument_grids(operation, _data_inputs(operation, names), grids)
    key = keys[0] if keys else None
    return key is not None and all(k == key for k in keys) \
        and all(keeps_grid(c, key) and np.ndim(c.scale) == 0 and c.requantization is None
                for c in config.output_quantization_config)


#: Ops that read only their input's shape: they read codes as they are (a transformer's Reshape takes
#: its target shape from a Shape of the very value it reshapes).
READS_SHAPE_ONLY = frozenset({"Shape", "Size"})


def run_on_codes(operation: Operation, kernel, names: tuple, values: dict, grids: dict, argument):
    """The results of a ``MOVES_CODES`` op run on the codes of its data inputs (all ``Codes`` on one grid,
    which its configs leave as they are), as ``Codes`` on that grid; None when that does not apply.
    ``names``: the op's input names; ``values``: the executor's values (read only); ``argument(name)``:
    the value of another input."""
    data = _data_inputs(operation, names)
    held = [values.get(name) for name in data]
    key = grids.get(data[0])
    if key is None or not all(isinstance(h, Codes) and h.codes() is not None and grids.get(n) == key
                              for h, n in zip(held, data)):
        return None
    config = operation.config
    if config is not None:
        ins = config.input_quantization_config[:len(data)]
        if not all(passes_through(c) or keeps_grid(c, key) for c in ins) or not all(
                passes_through(c) or keeps_grid(c, key) for c in config.output_quantization_config):
            return None
    arguments = [h.codes() for h in held] + [argument(name) for name in names[len(data):]]
    results = []
    for result in kernel(quantize_inputs(operation, arguments, names, grids)):
        if any(np.may_share_memory(result, h.codes()) for h in held):
            result = np.array(result)   # a view: the input's codes may turn into values in place later
        results.append(Codes(result, held[0].config))
    return results
