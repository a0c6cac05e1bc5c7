"""Pointwise activations written out as several ops (the finder :mod:`ppqlike.core.patterns` uses).

Exporters that predate the ONNX ops, and hand-written models, spell an activation with elementwise ops; left
as they are, every intermediate tensor is quantized (HardSwish as ``Add -> Clip -> Mul -> Div`` rounds four
times where a runtime rounds once).  An activation region (:mod:`ppqlike.core.block_regions`) is anchored at
its Clip, Relu, HardSigmoid, Sigmoid or Tanh, reads only scalar constants, and computes, on probe values from
-8 to 8, within 2e-3, one of

* ``hard_swish``: ``x * relu6(x + 3) / 6`` (MobileNetV3, PP-LCNet, PicoDet; also ``x * HardSigmoid(x)``);
* ``silu``: ``x * sigmoid(x)`` (Swish; YOLOv5/v8, EfficientNet);
* ``mish``: ``x * tanh(softplus(x))`` (YOLOv4).

A platform treats an activation block as it treats a GELU (``TransformerPolicy.gelu``): one function of one
tensor, run as a lookup table or fused into the kernel before it.
"""

from __future__ import annotations

import numpy as np

from .block_regions import Region, find_region, pointwise_form
from .ir import Operation

__all__ = ["activation_match", "ACTIVATION_ANCHORS"]

#: The ops an activation region is anchored at.
ACTIVATION_ANCHORS = frozenset({"Clip", "Relu", "HardSigmoid", "Sigmoid", "Tanh"})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Identity", "Cast", "Clip", "Relu", "HardSigmoid",
                          "Sigmoid", "Tanh", "Exp", "Log", "Softplus", "Min", "Max"})
_PROBE = np.linspace(-8.0, 8.0, 641)
_TOLERANCE = 2e-3


def _references() -> dict[str, np.ndarray]:
    x = _PROBE
    return {"hard_swish": x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
            "silu": x / (1.0 + np.exp(-x)),
            "mish": x * np.tanh(np.logaddexp(0.0, x))}


_REFERENCES = _references()


def activation_match(anchor: Operation, taken: set[str], graph_outputs: set[str]):
    """(form, region, ()) of the written-out activation whose nonlinearity is ``anchor``, or None."""
    if anchor.type not in ACTIVATION_ANCHORS:
        return None
    return find_region(anchor, _accept, taken, graph_outputs)


def _accept(region: Region):
    if len(region.operations) < 2:   # one op is the op itself (a Sigmoid), not an activation written out
        return None
    return pointwise_form(region, _ELEMENTWISE, _PROBE, _REFERENCES, _TOLERANCE)
