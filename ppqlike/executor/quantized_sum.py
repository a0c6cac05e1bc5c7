"""A quantized Add run block by block: a residual connection's inputs through their input configs, the sum,
and the sum through its output config, each block while it is in cache.

Run apart, the float simulation of a MobileNet-style residual Add reads and writes the whole activation up
to five times (each input fake-quantized into a new array, the sum, its output quantization); here each
block of the inputs is read once and the sum written once.  The blocks are the per-tensor path's own
(``numerics.QUANTIZE_BLOCK``, cut at the same multiples), and every stage is elementwise, so the bytes are
those of the ops run one by one.  Reads configs; writes nothing.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Operation
from ..core.layout import empty_like_dense, flat_view, same_layout
from ..core.numerics import QUANTIZE_BLOCK
from ..core.quant import TensorQuantizationConfig, is_applied
from ..core.quant_graph import requantized
from .ops._threads import parallel_items
from .simulation import grid_key, keeps_grid, passes_through


def quantized_sum(operation: Operation, arguments: list, names: tuple, grids: dict) -> tuple | None:
    """(the Add's result through its configs, the grid key it lies on or None), or None when this does not
    apply: two float32 arrays of one shape and memory order, of two blocks or more (a smaller one gains
    nothing), each input passed as it is or fake-quantized per tensor, the result fake-quantized per tensor
    or passed (no requantization)."""
    config = operation.config
    if config is None or len(arguments) != 2 or len(names) != 2 or len(config.input_quantization_config) != 2 \
            or len(config.output_quantization_config) != 1:
        return None
    a, b = arguments
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != np.float32 \
            or b.dtype != np.float32 or a.shape != b.shape or a.size < 2 * QUANTIZE_BLOCK or not same_layout(a, b) \
            or flat_view(a) is None:
        return None
    stages = [_input_stage(tqc, grids.get(name)) for tqc, name in zip(config.input_quantization_config, names)]
    output = config.output_quantization_config[0]
    if any(stage is False for stage in stages) or requantized(output, "output"):
        return None
    last = None if passes_through(output) else _per_tensor(output)
    if last is False:
        return None
    result = empty_like_dense(a)
    sources = [flat_view(a), flat_view(b)]
    target = flat_view(result)

    def scratch():
        return [np.empty(QUANTIZE_BLOCK, np.float32) if stage is not None else None for stage in stages]

    def block(index: int, local: list) -> None:
        start = index * QUANTIZE_BLOCK
        out = target[start:start + QUANTIZE_BLOCK]
        terms = []
        for source, stage, space in zip(sources, stages, local):
            term = source[start:start + QUANTIZE_BLOCK]
            if stage is not None:
                term = stage(term, space[:term.size])
            terms.append(term)
        np.add(terms[0], terms[1], out=out)
        if last is not None:
            last(out, out)
    parallel_items(block, -(-target.size // QUANTIZE_BLOCK), scratch)
    return result, None if last is None else grid_key(output)


def _input_stage(config: TensorQuantizationConfig | None, lies_on: tuple | None):
    """None (the value passes as it is), its fake quantizer, or False (not per tensor: run the op apart)."""
    if passes_through(config) or keeps_grid(config, lies_on):
        return None
    return _per_tensor(config)


def _per_tensor(config: TensorQuantizationConfig):
    """The fake quantizer ``(x, out)`` of an applied per-tensor config that does not pass values through
    (``passes_through`` is False), else False."""
    if not is_applied(config.state) or np.size(config.scale) != 1:
        return False
    return config.fake_quantizer()
