"""GELU in whatever ops it is written with (the finder :mod:`ppqlike.core.patterns` uses).

A GELU region (:mod:`ppqlike.core.block_regions`) is anchored at its Erf, Tanh or Sigmoid, reads only scalar
constants, and computes, on probe values from -6 to 6, within 2e-3, one of

* ``erf``: ``x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt 2))`` (torch's exact GELU);
* ``tanh``: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`` (BERT/GPT-2's, Keras' approximate);
* ``sigmoid``: ``x * sigmoid(1.702 * x)`` (quick GELU, CLIP's).

So x^3 as Pow 3 or Mul chains, ``x * (1 + 0.044715 * x * x)``, constants rounded to a few digits, any order of
the Muls and the 0.5 anywhere are all the same block; SiLU (``x * sigmoid(x)``, 0.18 away) is not a GELU.
"""

from __future__ import annotations

import math

import numpy as np

from .block_regions import Region, find_region, pointwise_form
from .ir import Operation

__all__ = ["gelu_match", "GELU_ANCHORS"]

#: The op a GELU region is anchored at.
GELU_ANCHORS = frozenset({"Erf", "Tanh", "Sigmoid"})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Erf", "Tanh", "Sigmoid", "Identity", "Cast"})
_PROBE = np.linspace(-6.0, 6.0, 481)
_TOLERANCE = 2e-3


def _references() -> dict[str, np.ndarray]:
    x = _PROBE
    erf = np.array([math.erf(v / math.sqrt(2.0)) for v in x])
    return {"erf": 0.5 * x * (1 + erf),
            "tanh": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
            "sigmoid": x / (1 + np.exp(-1.702 * x))}


_REFERENCES = _references()


def gelu_match(anchor: Operation, taken: set[str], graph_outputs: set[str]):
    """(form, region, ()) of the GELU whose Erf/Tanh/Sigmoid is ``anchor``, or None."""
    if anchor.type not in GELU_ANCHORS:
        return None
    return find_region(anchor, _accept, taken, graph_outputs)


def _accept(region: Region):
    return pointwise_form(region, _ELEMENTWISE, _PROBE, _REFERENCES, _TOLERANCE)
