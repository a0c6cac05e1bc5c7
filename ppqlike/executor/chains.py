"""Expansion chains at run time: a 1x1 Conv, its Relu/Clip, a zero Pad and the depthwise Conv that
alone reads it, with its Relu/Clip (``fusion.expand_chains``), run as one kernel.

* float: ``ops._conv_channels_last.expand_then_depthwise`` on the values,
  each block clipped by its Relu/Clip and fake-quantized by the config after
  it while it is in cache (the simulation of TensorRT-style platforms);
* integer (both Convs run as integer kernels: onnxruntime's, or requantized by
  multiplier and shift):
  ``integer_chains.expand_then_depthwise_codes`` on the input's codes.

Each runner returns the chain's result (and, for the integer one, the grid
key it lies on), or None when the chain does not apply to these values; the
executor then runs the ops one by one.  ``argument(name)`` gives the value of
a step input.  Reads configs; writes nothing.
"""

from __future__ import annotations

import numpy as np

from .fusion import activation_bounds, grid_edges, quantizing_epilogue
from .integer_codes import integer_codes
from .integer_chains import conv_codes, expand_then_depthwise_codes, input_on_grid
from .onnxruntime_kernels import applied_root
from .ops._conv_expand_chain import expand_then_depthwise
from .ops._prepared import prepared
from .ops.conv import conv2d_geometry
from .ops.tensor import zero_spatial_pads
from .simulation import argument_grids, grid_key, keeps_grid, passes_through, quantize_inputs
from ..core.quant_graph import input_config, output_config, overlapped_root


def output_grid(operation) -> tuple | None:
    """The grid key of the config that quantizes ``operation``'s result (through an OVERLAPPED chain)."""
    config = output_config(operation)
    return None if config is None else grid_key(overlapped_root(config))


def _geometry(second_step, x_shape, channels, filters, pad_step, argument):
    """The depthwise conv's (pads with a folded Pad's, strides, dilations), or None."""
    (top, left, bottom, right), strides, dilations = conv2d_geometry(
        second_step.operation, (x_shape[0], channels) + tuple(x_shape[2:]), filters.shape)
    if pad_step is not None:   # a zero Pad between, folded into the depthwise conv's pads
        extra = zero_spatial_pads([np.broadcast_to(np.float32(0), (1, 1, 1, 1))]
                                  + [argument(name) for name in pad_step.inputs[1:]])
        if extra is None:
            return None
        top, left, bottom, right = top + extra[0], left + extra[1], bottom + extra[2], right + extra[3]
    return (top, left, bottom, right), strides, dilations


def _bounds(steps, index, argument, opset):
    if index is None:
        return None
    step = steps[index]
    return activation_bounds(step.operation, [argument(name) for name in step.inputs[1:]], opset)


def _parameters(step, argument, grids: dict) -> list:
    """A Conv step's inputs through its input configs, the data input left None: the weight and bias it
    computes with."""
    return quantize_inputs(step.operation, [None] + [argument(name) for name in step.inputs[1:]], step.inputs, grids)


def _float_stage(steps: list, conv: int, activation: int | None, argument, opset: int):
    """``fusion.quantizing_epilogue`` of one Conv of a float chain (step ``conv``) and its Relu/Clip (step
    ``activation`` or None)."""
    return quantizing_epilogue(steps[conv].operation, None if activation is None else steps[activation].operation,
                               _bounds(steps, activation, argument, opset))


def run_float_chain(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int,
                    projection: tuple | None = None):
    """(the float chain's result, channels-last, the grid key it lies on or None, whether it is the
    projection's result), or None.

    ``arguments``: the first Conv's inputs, before its input configs.  ``projection``: (the 1x1 Conv that
    alone reads the chain's result, its Relu/Clip or None; ``fusion.chain_projections``), run inside too
    when its configs let it (``_projection_conv``).  What the convs compute with (``_float_chain_parts``) is
    kept across forwards as ``run_integer_chain``'s is."""
    first = steps[index]
    x = quantize_inputs(first.operation, arguments[:1], first.inputs[:1], grids)[0]
    made = _kept(_float_chain_parts, "float chain", chain, steps, index, arguments, argument, grids, opset,
                 projection, np.shape(x))
    if made is None:
        return None
    first_conv, second_conv, geometry, lies_on, third = made
    if third is not None:
        out = expand_then_depthwise(x, first_conv, second_conv, *geometry, third[0])
        if out is not None:
            return out, third[1], True
    out = expand_then_depthwise(x, first_conv, second_conv, *geometry)
    return None if out is None else (out, lies_on, False)


def _float_chain_parts(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int,
                       projection: tuple | None, shape: tuple) -> tuple | None:
    """((weight, bias, epilogue) of the expansion and of the depthwise conv, the depthwise geometry, the grid
    key the depthwise result lies on, ``_projection_conv``'s or None) of a float chain whose input has
    ``shape``; None when it does not apply."""
    first_activation, pad, second, second_activation = chain
    first, depthwise = steps[index], steps[second]
    stages = [_float_stage(steps, index, first_activation, argument, opset),
              _float_stage(steps, second, second_activation, argument, opset)]
    if stages[0] is None or stages[1] is None:
        return None
    data = input_config(depthwise.operation, 0)
    if not (passes_through(data) or keeps_grid(data, stages[0][1])):
        return None   # the depthwise conv's input config would change the expanded values
    weights = quantize_inputs(first.operation, [None] + list(arguments[1:]), first.inputs, grids)[1:]
    filters = _parameters(depthwise, argument, grids)[1:]
    geometry = _geometry(depthwise, shape, weights[0].shape[0], filters[0], steps[pad] if pad is not None else None,
                         argument)
    if geometry is None:
        return None
    first_conv = (weights[0], weights[1] if len(weights) > 1 else None, stages[0][0])
    second_conv = (filters[0], filters[1] if len(filters) > 1 else None, stages[1][0])
    third = None
    if projection is not None:
        third = _projection_conv(steps, projection, stages[1][1], argument, grids, opset)
    return first_conv, second_conv, geometry, stages[1][1], third


def _kept(parts, kind: str, chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict,
          opset: int, projection: tuple | None, shape: tuple, lies_on: tuple | None = None):
    """``parts(...)`` of a chain (what its convs compute with), kept across forwards (``ops._prepared``) for
    its constant parameters, under the revisions of the configs of its ops
    (``TensorQuantizationConfig.revision``), the shape of its input and the grid it lies on."""
    first_activation, pad, second, second_activation = chain
    members = [steps[i] for i in (index, first_activation, pad, second, second_activation) + tuple(projection or ())
               if i is not None]
    parameters = tuple(arguments[1:]) + tuple(argument(name) for step in members[1:] for name in step.inputs[1:])
    key = (kind, index, chain, projection, id(steps[index].operation), tuple(shape), lies_on,
           tuple(_revisions(step.operation) for step in members))
    return prepared(lambda: parts(chain, steps, index, arguments, argument, grids, opset, projection, shape), key,
                    parameters)


def _projection_conv(steps: list, projection: tuple, lies_on: tuple | None, argument, grids: dict, opset: int):
    """((weight, bias, epilogue) of a chain's projection, the grid key its result ends on), or None when its
    configs ask for more than the float chain does; ``lies_on``: the grid key of the chain's result."""
    conv, activation = projection
    operation = steps[conv].operation
    stage = _float_stage(steps, conv, activation, argument, opset)
    data = input_config(operation, 0)
    if stage is None or not (passes_through(data) or keeps_grid(data, lies_on)):
        return None
    parameters = _parameters(steps[conv], argument, grids)[1:]
    return (parameters[0], parameters[1] if len(parameters) > 1 else None, stage[0]), stage[1]


def run_integer_chain(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int,
                      projection: tuple | None = None):
    """(the integer chain's result as ``Codes``, the grid key it lies on, whether it is the projection's
    result), or None.

    ``arguments``: the first Conv's inputs (``Codes`` kept), before its input configs; ``projection``: as
    ``run_float_chain``'s, run inside too where its codes allow (``_projection_codes``).  What the convs
    compute with (``_chain_codes``) is kept across forwards (``_kept``)."""
    _, pad, second, _ = chain
    first = steps[index]
    if pad is not None:
        return None
    data = quantize_inputs(first.operation, arguments[:1], first.inputs[:1], grids)[0]
    lies_on = argument_grids(first.operation, first.inputs[:1], grids)[0]
    if not input_on_grid(first.operation, lies_on):
        return None
    x = integer_codes(applied_root(input_config(first.operation, 0)), data, on_grid=True)
    made = _kept(_chain_codes, "integer chain", chain, steps, index, arguments, argument, grids, opset, projection,
                 x.shape, lies_on)
    if made is None:
        return None
    codes, geometry, third = made
    if third is not None:
        out = expand_then_depthwise_codes(x, codes[0], codes[1], *geometry, third)
        if out is not None:
            return out, output_grid(steps[projection[0]].operation), True
    out = expand_then_depthwise_codes(x, codes[0], codes[1], *geometry)
    return None if out is None else (out, output_grid(steps[second].operation), False)


def _revisions(operation) -> tuple | None:
    """The revisions of an op's configs (``TensorQuantizationConfig.revision``), in order."""
    config = operation.config
    if config is None:
        return None
    return tuple(None if tqc is None else tqc.revision
                 for tqc in config.input_quantization_config + config.output_quantization_config)


def _chain_codes(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int,
                 projection: tuple | None, shape: tuple) -> tuple | None:
    """(the ``ConvCodes`` of the expansion and the depthwise conv, the depthwise geometry, the projection's
    ``ConvCodes`` or None) of an integer chain whose input codes have ``shape``; None when it does not apply."""
    first_activation, _, second, second_activation = chain
    first, depthwise = steps[index], steps[second]
    arguments = quantize_inputs(first.operation, arguments, first.inputs, grids)
    edges = [None if i is None else grid_edges(steps[i].operation, _bounds(steps, i, argument, opset),
                                               output_grid(operation))
             for i, operation in ((first_activation, first.operation), (second_activation, depthwise.operation))]
    if (first_activation is not None and edges[0] is None) or (second_activation is not None and edges[1] is None) \
            or not input_on_grid(depthwise.operation, output_grid(first.operation)):
        return None
    filters = _parameters(depthwise, argument, grids)
    codes = conv_codes(first.operation, arguments, edges[0]), conv_codes(depthwise.operation, filters, edges[1])
    if codes[0] is None or codes[1] is None:
        return None
    geometry = _geometry(depthwise, shape, codes[0].weight.shape[0], codes[1].weight, None, argument)
    third = None
    if projection is not None:
        third = _projection_codes(steps, projection, output_grid(depthwise.operation), argument, grids, opset)
    return codes, geometry, third


def _projection_codes(steps: list, projection: tuple, lies_on: tuple | None, argument, grids: dict, opset: int):
    """``ConvCodes`` of a chain's projection whose input config takes the chain's result (on grid
    ``lies_on``) as it is, its Relu/Clip folded into its clamp; None otherwise."""
    conv, activation = projection
    operation = steps[conv].operation
    if not input_on_grid(operation, lies_on):
        return None
    edges = None if activation is None else grid_edges(steps[activation].operation,
                                                       _bounds(steps, activation, argument, opset),
                                                       output_grid(operation))
    if activation is not None and edges is None:
        return None
    return conv_codes(operation, _parameters(steps[conv], argument, grids), edges)
