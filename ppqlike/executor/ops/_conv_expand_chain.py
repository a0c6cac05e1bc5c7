"""A 1x1 convolution and the depthwise convolution reading its result, run as one kernel, a group of images
at a time, so that the (large) expanded activation never goes to memory whole (MobileNetV2's 16 of them:
258 -> 229 ms a batch).  Built on ``_conv_channels_last``'s GEMM and tap groups; same layout and rules."""

from __future__ import annotations

import numpy as np

from ._conv_channels_last import _Gemm, _tap_groups_of, is_channels_last
from ._threads import parallel_items

__all__ = ["expand_then_depthwise"]


def expand_then_depthwise(x: np.ndarray, expand: tuple, depthwise: tuple, pads, strides, dilations,
                          project: tuple | None = None):
    """A 1x1 convolution and the depthwise convolution reading its result, a group of images at a time:
    the 1x1's GEMM writes into a buffer of the thread, from which each image goes into the depthwise
    convolution's buffer through the 1x1's epilogue (one pass for both), so the (large) expanded
    activation never goes to memory whole.
    ``expand`` / ``depthwise`` / ``project``: (weight, bias or None, epilogue or None) of each; ``project``, a
    1x1 convolution reading the depthwise result, runs too, GEMM group by GEMM group of its own: the
    depthwise results of a group's images go from a buffer of the thread (in cache) into the same GEMM call
    the projection makes alone.  ``x`` channels-last float32; the depthwise geometry must be "same" (see the
    module).  Returns the last convolution's result channels-last, equal bit for bit to the convolutions
    run one after the other (the same GEMMs, the same tap groups); None when this does not apply (a
    projection also needs the expansion's GEMM groups to lie within its own; then run them so)."""
    (w1, b1, epilogue1), (w2, b2, epilogue2) = expand, depthwise
    n, ci, h, wd = x.shape
    co, dtype = w1.shape[0], x.dtype
    kh, kw = w2.shape[2], w2.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    if dtype != np.float32 or not is_channels_last(x) or ho * sh != h or wo * sw != wd or ho <= 0 or wo <= 0 \
            or w2.shape[:2] != (co, 1) or (project is not None and project[0].shape[1:] != (co, 1, 1)):
        return None
    gemm = _Gemm(w1, b1, h * wd, n, dtype)
    third = None if project is None else _Gemm(project[0], project[1], ho * wo, n, dtype)
    if third is not None and gemm.images not in (1, third.images):
        return None
    plan = _tap_groups_of(co, h, wd, w2, b2, pads, strides, dilations, dtype)
    source = x.transpose(0, 2, 3, 1).reshape(n, h * wd, ci)
    outputs = co if third is None else third.co
    out = np.empty((n, ho, wo, outputs), dtype)
    groups = (gemm if third is None else third).groups(n)
    totals = np.zeros(len(groups))

    def workspace():
        return (plan.workspace(), gemm.inputs(), np.empty((gemm.images, h, wd, co), dtype),
                None if third is None else (third.inputs(), np.empty((third.images, ho, wo, co), dtype)))

    def run(group, local):
        space, inputs, expanded, projecting = local
        i0, i1 = groups[group]
        results = out[i0:i1] if third is None else projecting[1]   # where the depthwise results go
        for e0 in range(i0, i1, gemm.images):
            e1 = min(i1, e0 + gemm.images)
            gemm.run(source[e0:e1].reshape(-1, ci), expanded[:e1 - e0].reshape(-1, co), inputs, None)
            for image in range(e0, e1):
                plan.fill(space, expanded[image - e0], epilogue1)
                totals[group] += plan.compute(space, results[image - i0].reshape(ho, plan.row), epilogue2)
        if third is not None:
            third.run(results[:i1 - i0].reshape(-1, co), out[i0:i1].reshape(-1, outputs), projecting[0], project[2])

    parallel_items(run, len(groups), workspace)
    return out.transpose(0, 3, 1, 2) if np.isfinite(totals).all() else None
