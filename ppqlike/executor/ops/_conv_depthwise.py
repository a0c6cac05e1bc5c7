"""Depthwise 2-D convolution (one filter per channel) in NCHW, used by ``conv.py`` for what
``_conv_channels_last`` does not take: "valid" geometries on large maps of few channels, and inputs
holding inf or NaN.

A few shifted multiply-adds (``np.multiply(..., out=tmp)``, ``np.add(...,
out=acc)``) per chunk of about ``_CHUNK`` elements (one image or a few, a
block of channels) so that the operands stay in L2.  Small maps ("same"
geometry, stride 1 or 2): the chunk is copied flat between zero margins and
the padding is cancelled by zeros in per-position weights - no padded copy, no
output extraction; a "valid" convolution of an input whose border is zero (an
explicit Pad before it, as in EfficientNet) is run as a "same" one of the
interior. Large maps: a zero-padded copy split into stride phases, one row per
channel, weights broadcast.  About 2-3x onnxruntime's time with 3x3 kernels,
4-7x with 5x5: numpy's ceiling is about 7 multiply-adds per ns per core,
onnxruntime's fused kernels do 15-28.

Inputs are NCHW and never written; the result is a fresh contiguous NCHW array.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._threads import num_threads, parallel, split_evenly

_CHUNK = 1 << 15          # elements per chunk array (128 KiB of float32): acc, tmp, input stay in L2
_EXPAND_BELOW = 3000      # positions per channel below which weights are expanded per position
_CHUNK_IMAGES = 1 << 16   # elements per chunk when several images share one (small maps)
_CHUNK_PADDED = 1 << 16   # elements per chunk of the padded method (large maps, long rows)


def _run_split(run, images: int, blocks: int) -> None:
    """Call ``run(image range, block range)`` on the threads: split over images, or over channel blocks
    when there are fewer images than threads."""
    threads = num_threads()
    if images >= threads or blocks < 2:
        jobs = [(part, (0, blocks)) for part in split_evenly(images, threads)]
    else:
        jobs = [((0, images), part) for part in split_evenly(blocks, threads)]
    parallel(run, jobs)


def depthwise(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations,
              dtype) -> np.ndarray:
    """Depthwise 2-D convolution: ``x`` [N,C,H,W], ``w`` [C,1,kh,kw], one filter per channel.

    ``pads`` is (top, left, bottom, right).  Returns [N,C,Ho,Wo] of ``dtype``.
    """
    h, wd = x.shape[2:]
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    same = same_geometry(x, pads, strides, ho, wo) if 0 < ho * wo < _EXPAND_BELOW else None
    if same is not None:
        out = _depthwise_same(same[0], w, b, same[1], strides, dilations, dtype, ho, wo)
        if out is not None:
            return out
    return _depthwise_padded(x, w, b, pads, strides, dilations, dtype)


def same_geometry(x: np.ndarray, pads, strides, ho: int, wo: int):
    """(input, pads) running a convolution with output ``ho`` x ``wo`` as one whose output grid is its
    input's stride-phase grid ("same"): ``x`` itself when it is so; the interior of ``x`` when the
    convolution is a "valid" one of an input padded beforehand with zeros (an explicit Pad op, as in
    EfficientNet), the border becoming pads; None otherwise."""
    h, wd = x.shape[2], x.shape[3]
    (sh, sw), source = strides, x
    if (ho * sh != h or wo * sw != wd) and not any(pads):
        split = zero_border(x, h - ho * sh, wd - wo * sw)
        if split is not None:
            top, left, bottom, right = split
            source, pads = x[:, :, top:h - bottom, left:wd - right], split
    if ho * sh == source.shape[2] and wo * sw == source.shape[3]:
        return source, pads
    return None


def zero_border(x: np.ndarray, rows: int, cols: int):
    """(top, left, bottom, right) with top + bottom = rows and left + right = cols such that those
    rows and columns of ``x`` are all zero; None if there is none (or rows/cols is negative)."""
    if rows < 0 or cols < 0:
        return None
    h, w = x.shape[2], x.shape[3]

    def split(count, size, edge):
        for first in sorted(range(count + 1), key=lambda t: abs(t - count // 2)):  # centred first
            last = count - first
            if not edge(0, first).any() and not edge(size - last, size).any():
                return first, last
        return None
    vertical = split(rows, h, lambda a, z: x[:, :, a:z, :])
    horizontal = split(cols, w, lambda a, z: x[:, :, :, a:z])
    if vertical is None or horizontal is None:
        return None
    return vertical[0], horizontal[0], vertical[1], horizontal[1]


def _depthwise_same(x, w, b, pads, strides, dilations, dtype, ho, wo):
    """Depthwise convolution whose output grid is the input's phase grid ("same" padding, H and W
    multiples of the stride): no padded copy and no output extraction.

    The input chunk is copied flat (split into stride phases) between zero
    margins; every tap reads it shifted by a constant, and the reads that
    fall in the padding (they wrap into the neighbouring row or channel) are
    cancelled by a zero in the per-position weights.  A zero weight cancels
    only a finite value: if any output is not finite (an inf or NaN input
    could have leaked through a cancelled read), None is returned and the
    caller recomputes with the padded method.
    """
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    sh, sw = strides
    dh, dw = dilations
    pt, pl = pads[0], pads[1]
    plane = ho * wo
    phases = sh * sw
    taps, masks = [], []
    rows, cols = np.arange(ho), np.arange(wo)
    for a in range(kh):
        ra = a * dh - pt
        pa, di = ra % sh, ra // sh
        row_ok = (rows + di >= 0) & (rows + di < ho)
        for bb in range(kw):
            rb = bb * dw - pl
            pb_, dj = rb % sw, rb // sw
            col_ok = (cols + dj >= 0) & (cols + dj < wo)
            taps.append((pa * sw + pb_, di * wo + dj))
            masks.append((row_ok[:, None] & col_ok[None, :]).reshape(-1))
    ntaps = len(taps)
    low = max(0, -min(o for _, o in taps))
    high = max(0, max(o for _, o in taps))
    block = max(1, min(c, _CHUNK // plane))
    blocks = [(c0, min(c, c0 + block)) for c0 in range(0, c, block)]
    weights = w.reshape(c, ntaps).astype(dtype, copy=False)
    masks = np.asarray(masks, dtype)                                  # [taps, plane]
    out = np.empty((n, c, ho, wo), dtype)
    flat_out = out.reshape(n, c * plane)
    finite = []

    def run(job):
        (n0, n1), (b0, b1) = job
        group = max(1, min(n1 - n0, _CHUNK_IMAGES // (block * plane)))   # images per chunk
        row = low + block * plane + high
        buffer = np.zeros((phases, group, row), dtype)
        tmp = np.empty((group, block * plane), dtype)
        total = 0.0
        with np.errstate(all="ignore"):
            for c0, c1 in blocks[b0:b1]:
                m = c1 - c0
                size = m * plane
                wexp = np.empty((ntaps, m, plane), dtype)
                np.multiply(weights[c0:c1].T[:, :, None], masks[:, None, :], out=wexp)
                wexp = wexp.reshape(ntaps, size)
                bexp = None
                if b is not None:
                    bexp = np.empty((m, plane), dtype)
                    bexp[...] = b[c0:c1].astype(dtype, copy=False)[:, None]
                    bexp = bexp.reshape(size)
                for i0 in range(n0, n1, group):
                    k = min(group, n1 - i0)
                    source = x[i0:i0 + k, c0:c1]
                    if phases == 1:
                        buffer[0, :k, low:low + size].reshape(k, m, h, wd)[...] = source
                    else:
                        buffer[:, :k, low:low + size].reshape(sh, sw, k, m, ho, wo)[...] = \
                            source.reshape(k, m, ho, sh, wo, sw).transpose(3, 5, 0, 1, 2, 4)
                    o_ = flat_out[i0:i0 + k, c0 * plane:c1 * plane]
                    t_ = tmp[:k, :size]
                    ph, o = taps[0]
                    np.multiply(buffer[ph, :k, low + o:low + o + size], wexp[0], out=o_)
                    for t in range(1, ntaps):
                        ph, o = taps[t]
                        np.multiply(buffer[ph, :k, low + o:low + o + size], wexp[t], out=t_)
                        np.add(o_, t_, out=o_)
                    if bexp is not None:
                        np.add(o_, bexp, out=o_)
                    total += float(np.add.reduce(o_, axis=None))
        finite.append(np.isfinite(total))

    _run_split(run, n, len(blocks))
    return out if all(finite) else None


def _depthwise_padded(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations,
                      dtype) -> np.ndarray:
    """Depthwise convolution of any geometry, over a zero-padded copy of the input.

    Per chunk (one image, a block of channels) the input is copied once into
    a zero-padded buffer, split into its stride phases, and every tap is one
    multiply and one add over a contiguous (or row-strided) slice of it.
    Small maps are processed flat over (channel, position) with the weights
    expanded per position, so that each ufunc call is long; large maps one
    row per channel with the weight broadcast along it.  Positions between
    rows are computed and dropped.
    """
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    hp, wp = h + pt + pb, wd + pl + pr
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((n, c, max(ho, 0), max(wo, 0)), dtype)
    if out.size == 0:
        return out
    # The padded input, split into sh*sw phases of hs x ws each (one phase when stride 1):
    # phase (pa, pb)[u, v] = xpad[u*sh + pa, v*sw + pb].  Tap (a, b) reads phase
    # ((a*dh) % sh, (b*dw) % sw) at offset ((a*dh)//sh, (b*dw)//sw) from output (i, j).
    hs, ws = -(-hp // sh), -(-wp // sw)
    plane = hs * ws
    taps = [(((a * dh) % sh) * sw + (bb * dw) % sw, ((a * dh) // sh) * ws + (bb * dw) // sw)
            for a in range(kh) for bb in range(kw)]
    ntaps = len(taps)
    extra = max(o for _, o in taps)
    span = ho * ws                      # positions computed per channel (rows of the phase grid)
    expand = span < _EXPAND_BELOW
    block = max(1, min(c, _CHUNK_PADDED // plane))
    blocks = [(c0, min(c, c0 + block)) for c0 in range(0, c, block)]
    phases = sh * sw
    weights = w.reshape(c, ntaps).astype(dtype, copy=False)
    bias = None if b is None else b.astype(dtype, copy=False).reshape(c, 1, 1)
    itemsize = np.dtype(dtype).itemsize

    def run(job):
        (n0, n1), (b0, b1) = job
        buffer = np.zeros((phases, block * plane + extra), dtype)
        staging = np.zeros((block, hs * sh, ws * sw), dtype) if phases > 1 else None
        acc = np.empty(block * plane, dtype)
        tmp = np.empty(block * plane, dtype)
        with np.errstate(all="ignore"):  # garbage lanes between rows may overflow; they are dropped
            for c0, c1 in blocks[b0:b1]:
                m = c1 - c0
                if expand:   # flat over (channel, position): one long ufunc call per tap
                    size = m * plane
                    wexp = np.empty((ntaps, m, plane), dtype)
                    wexp[...] = weights[c0:c1].T[:, :, None]
                    wexp = wexp.reshape(ntaps, size)
                    views = [buffer[ph, o:o + size] for ph, o in taps]
                    a_, t_ = acc[:size], tmp[:size]
                    result = a_.reshape(m, hs, ws)[:, :ho, :wo]
                else:        # one row per channel, weight broadcast along it
                    a_ = acc[:m * span].reshape(m, span)
                    t_ = tmp[:m * span].reshape(m, span)
                    views = [as_strided(buffer[ph, o:], shape=(m, span), strides=(plane * itemsize, itemsize))
                             for ph, o in taps]
                    wexp = [weights[c0:c1, t:t + 1] for t in range(ntaps)]
                    result = a_.reshape(m, ho, ws)[:, :, :wo]
                if phases == 1:
                    interior = buffer[0, :m * plane].reshape(m, hs, ws)[:, pt:pt + h, pl:pl + wd]
                else:        # pad into a staging buffer, then split the phases in one gather
                    interior = staging[:m, pt:pt + h, pl:pl + wd]
                    split_source = staging[:m].reshape(m, hs, sh, ws, sw).transpose(2, 4, 0, 1, 3)
                    split_target = buffer[:, :m * plane].reshape(sh, sw, m, hs, ws)
                chunk_bias = None if bias is None else bias[c0:c1]
                for image in range(n0, n1):
                    interior[...] = x[image, c0:c1]
                    if phases > 1:
                        split_target[...] = split_source
                    np.multiply(views[0], wexp[0], out=a_)
                    for t in range(1, ntaps):
                        np.multiply(views[t], wexp[t], out=t_)
                        np.add(a_, t_, out=a_)
                    if chunk_bias is None:
                        out[image, c0:c1] = result
                    else:
                        np.add(result, chunk_bias, out=out[image, c0:c1])

    _run_split(run, n, len(blocks))
    return out


# ------------------------------------------------------------------- im2col --
