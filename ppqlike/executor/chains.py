"""Expansion chains at run time: a 1x1 Conv, its Relu/Clip, a zero Pad and the depthwise Conv that
alone reads it, with its Relu/Clip (``fusion.expand_chains``), run as one kernel.

* float: ``ops._conv_channels_last.expand_then_depthwise`` on the values,
  each block clipped by its Relu/Clip and fake-quantized by the config after
  it while it is in cache (the simulation of TensorRT-style platforms);
* integer (both Convs marked for onnxruntime's kernels):
  ``onnxruntime_chains.expand_then_depthwise_codes`` on the input's codes.

Each runner returns the chain's result (and, for the integer one, the grid
key it lies on), or None when the chain does not apply to these values; the
executor then runs the ops one by one.  ``argument(name)`` gives the value of
a step input.  Reads configs; writes nothing.
"""

from __future__ import annotations

import numpy as np

from .fusion import activation_bounds, clip_epilogue, configs_let_fuse, grid_edges
from .integer_codes import integer_codes
from .onnxruntime_chains import conv_codes, expand_then_depthwise_codes, input_on_grid
from .onnxruntime_kernels import applied_root
from .ops._conv_channels_last import expand_then_depthwise
from .ops.conv import conv2d_geometry
from .ops.tensor import zero_spatial_pads
from .simulation import argument_grids, grid_key, keeps_grid, passes_through, quantize_inputs
from ..core.quant import is_applied
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


def _float_stage(steps: list, conv: int, activation: int | None, argument, opset: int):
    """(in-place work on each block of a float Conv's result, the grid key the block ends on) for one
    Conv of a float chain and its Relu/Clip: the clip, then the output quantization that follows
    (per tensor, no requantization); None when the configs ask for more."""
    operation = steps[conv].operation
    clip = None
    if activation is not None:
        if not configs_let_fuse(operation, steps[activation].operation):
            return None
        clip = clip_epilogue(_bounds(steps, activation, argument, opset))
        operation = steps[activation].operation
    config = output_config(operation)
    if passes_through(config):
        return clip, None
    if not is_applied(config.state) or config.requantization is not None or np.size(config.scale) != 1:
        return None

    def quantize(block: np.ndarray, out: np.ndarray | None = None) -> None:
        target = block if out is None else out
        if clip is not None:
            clip(block, target)
            block = target
        config.fake_quantize(block, out=target)
    return quantize, grid_key(config)


def run_float_chain(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int,
                    projection: tuple | None = None):
    """(the float chain's result, channels-last, the grid key it lies on or None, whether it is the
    projection's result), or None.

    ``arguments``: the first Conv's inputs, before its input configs.  ``projection``: (the 1x1 Conv that
    alone reads the chain's result, its Relu/Clip or None; ``fusion.chain_projections``), run inside too
    when no config touches the ops (the FP32 graph)."""
    first_activation, pad, second, second_activation = chain
    first, depthwise = steps[index], steps[second]
    stages = [_float_stage(steps, index, first_activation, argument, opset),
              _float_stage(steps, second, second_activation, argument, opset)]
    if stages[0] is None or stages[1] is None:
        return None
    data = input_config(depthwise.operation, 0)
    if not (passes_through(data) or keeps_grid(data, stages[0][1])):
        return None   # the depthwise conv's input config would change the expanded values
    arguments = quantize_inputs(first.operation, arguments, first.inputs, grids)
    filters = quantize_inputs(depthwise.operation, [None] + [argument(name) for name in depthwise.inputs[1:]],
                              depthwise.inputs, grids)[1:]
    x, weight = arguments[0], arguments[1]
    geometry = _geometry(depthwise, x.shape, weight.shape[0], filters[0],
                         steps[pad] if pad is not None else None, argument)
    if geometry is None:
        return None
    first_conv = (weight, arguments[2] if len(arguments) > 2 else None, stages[0][0])
    second_conv = (filters[0], filters[1] if len(filters) > 1 else None, stages[1][0])
    if projection is not None and all(steps[i].operation.config is None for i in chain + (index,) + projection
                                      if i is not None):
        third = [argument(name) for name in steps[projection[0]].inputs[1:]]
        out = expand_then_depthwise(x, first_conv, second_conv, *geometry,
                                    (third[0], third[1] if len(third) > 1 else None,
                                     clip_epilogue(_bounds(steps, projection[1], argument, opset))))
        if out is not None:
            return out, None, True
    out = expand_then_depthwise(x, first_conv, second_conv, *geometry)
    return None if out is None else (out, stages[1][1], False)


def run_integer_chain(chain: tuple, steps: list, index: int, arguments: list, argument, grids: dict, opset: int):
    """(the integer chain's result as ``Codes``, the grid key it lies on, False), or None.

    ``arguments``: the first Conv's inputs (``Codes`` kept), before its input configs."""
    first_activation, pad, second, second_activation = chain
    first, depthwise = steps[index], steps[second]
    if pad is not None:
        return None
    arguments = quantize_inputs(first.operation, arguments, first.inputs, grids)
    if not input_on_grid(first.operation, argument_grids(first.operation, first.inputs, grids)[0]):
        return None
    edges = [None if i is None else grid_edges(steps[i].operation, _bounds(steps, i, argument, opset),
                                               output_grid(operation))
             for i, operation in ((first_activation, first.operation), (second_activation, depthwise.operation))]
    if (first_activation is not None and edges[0] is None) or (second_activation is not None and edges[1] is None) \
            or not input_on_grid(depthwise.operation, output_grid(first.operation)):
        return None
    filters = quantize_inputs(depthwise.operation, [None] + [argument(name) for name in depthwise.inputs[1:]],
                              depthwise.inputs, grids)
    codes = conv_codes(first.operation, arguments, edges[0]), conv_codes(depthwise.operation, filters, edges[1])
    if codes[0] is None or codes[1] is None:
        return None
    x = integer_codes(applied_root(input_config(first.operation, 0)), arguments[0], on_grid=True)
    geometry = _geometry(depthwise, x.shape, codes[0].weight.shape[0], codes[1].weight, None, argument)
    out = expand_then_depthwise_codes(x, codes[0], codes[1], *geometry)
    return None if out is None else (out, output_grid(depthwise.operation), False)
