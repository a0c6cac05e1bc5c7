"""Fast numpy paths for 2-D convolution, shared by the conv family (see ``conv.py``).

Everything here takes NCHW arrays and returns a fresh, contiguous NCHW array;
inputs are never written.  Nothing is cached across calls: weights are
re-read (and re-laid-out, which is cheap next to the convolution) every call.

Three paths, chosen by ``conv.py`` (times below: batch 16 on a 2-vCPU AMD
EPYC VM, OpenBLAS pinned to its Haswell kernels, against onnxruntime 1.31
with 2 threads; see ``bench/executor_speed.py --per-layer``):

* ``pointwise`` - 1x1 convolution: one GEMM per image, ``W[Co,Ci] @ X[n]``,
  straight into the NCHW output; below ``_ONE_GEMM_BELOW`` positions (7x7
  maps) one GEMM for the whole batch.  The bias rides inside the GEMM as an
  input row of ones when the output is much wider than the input.  About as
  fast as onnxruntime (MobileNetV2's 34 layers: 27 ms vs 29 ms).
* ``depthwise`` - one filter per channel.  A few shifted multiply-adds
  (``np.multiply(..., out=tmp)``, ``np.add(..., out=acc)``) per chunk of about
  ``_CHUNK`` elements (one image or a few, a block of channels) so that the
  operands stay in L2.  Small maps ("same" geometry, stride 1 or 2): the
  chunk is copied flat between zero margins and the padding is cancelled by
  zeros in per-position weights - no padded copy, no output extraction;
  a "valid" convolution of an input whose border is zero (an explicit Pad
  before it, as in EfficientNet) is run as a "same" one of the interior.
  Large maps: a zero-padded copy split into stride phases, one row per
  channel, weights broadcast.  About 2-3x onnxruntime's time with 3x3
  kernels, 4-7x with 5x5: numpy's ceiling is about 7 multiply-adds per ns
  per core, onnxruntime's fused kernels do 15-28.
* ``im2col`` - everything else (dense k x k, grouped): a patch matrix built
  from a ``sliding_window_view`` and one GEMM per group, a few images at a
  time so that the patches stay in cache, the bias as a row of ones.
  Patches are channels-last (contiguous channel runs) when a group has at
  least ``_CHANNELS_LAST_MIN`` channels, else channels-first.

Threads: independent work (the images of a 1x1 convolution, depthwise
chunks, patch matrices) can run on ``PPQLIKE_NUM_THREADS`` Python threads
(numpy and BLAS release the GIL); the default is 1, leaving parallelism to
BLAS.  On 2-vCPU machines the fastest setting measured was the other way
round: ``OPENBLAS_NUM_THREADS=1`` with ``PPQLIKE_NUM_THREADS=2`` (depthwise
layers about 25% faster, 1x1 layers about as fast, and no collapse when
another process takes a core, which OpenBLAS's spin-waiting threads suffer).
A second Python thread next to a multi-threaded OpenBLAS made things slower.
Change it at run time with :func:`set_num_threads`.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

# ------------------------------------------------------------------ threads --
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()
_NUM_THREADS: int | None = None


def _default_threads() -> int:
    value = os.environ.get("PPQLIKE_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def num_threads() -> int:
    """Threads the elementwise conv paths use (BLAS has its own setting)."""
    global _NUM_THREADS
    if _NUM_THREADS is None:
        _NUM_THREADS = _default_threads()
    return _NUM_THREADS


def set_num_threads(count: int | None) -> None:
    """Use ``count`` threads for the elementwise conv paths (None: back to the default)."""
    global _NUM_THREADS
    _NUM_THREADS = None if count is None else max(1, int(count))


def parallel(function, jobs) -> None:
    """Run ``function(job)`` for every job, on the pool when there are several."""
    jobs = list(jobs)
    threads = min(num_threads(), len(jobs))
    if threads <= 1 or threading.current_thread().name.startswith("ppqlike-conv"):
        for job in jobs:
            function(job)
        return
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < threads:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ppqlike-conv")
            _POOL_SIZE = threads
        pool = _POOL
    for future in [pool.submit(function, job) for job in jobs]:
        future.result()


def _split(count: int, parts: int) -> list[tuple[int, int]]:
    """``range(count)`` cut into at most ``parts`` contiguous, non-empty, balanced pieces."""
    parts = max(1, min(parts, count))
    bounds = [count * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]]


# ---------------------------------------------------------------- pointwise --
_ONE_GEMM_BELOW = 100     # H*W below which a 1x1 convolution is one GEMM over the whole batch


def pointwise(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, dtype) -> np.ndarray:
    """1x1 convolution, stride 1, no padding, one group: ``x`` [N,Ci,H,W], ``w`` [Co,Ci,1,1].

    Large maps: one GEMM per image, ``W[Co,Ci] @ X[n][Ci,H*W]``, straight into
    the NCHW output.  Small maps: per-image GEMMs would be thin and many, so
    the batch is gathered into one ``[Ci, N*H*W]`` matrix (a cheap copy at
    that size), multiplied once, and scattered back.  The bias rides inside
    the GEMM as an input row of ones whenever the input is copied anyway or
    is much smaller than the output; else it is one pass over the output.
    """
    n, ci, h, wd = x.shape
    co = w.shape[0]
    hw = h * wd
    w2 = w.reshape(co, ci).astype(dtype, copy=False)
    with_bias = b is not None
    rows = ci + with_bias
    if with_bias:
        wa = np.empty((co, rows), dtype)
        wa[:, :ci] = w2
        wa[:, ci] = b
    else:
        wa = w2
    if hw < _ONE_GEMM_BELOW and n > 1:
        xt = np.empty((rows, n, hw), dtype)
        xt[:ci] = x.reshape(n, ci, hw).transpose(1, 0, 2)
        if with_bias:
            xt[ci] = 1
        y = np.matmul(wa, xt.reshape(rows, n * hw))
        out = np.empty((n, co, h, wd), dtype)
        out.reshape(n, co, hw)[...] = y.reshape(co, n, hw).transpose(1, 0, 2)
        return out
    x3 = x.reshape(n, ci, hw)
    threads = num_threads()
    if threads > 1 and n > 1:
        # the images are independent GEMMs: spread them on the pool (worth it when BLAS itself runs
        # single-threaded; a descheduled thread then only delays its own images)
        out = np.empty((n, co, h, wd), dtype)
        out3 = out.reshape(n, co, hw)
        parallel(lambda images: _pointwise_images(w2, wa, b, x3, out3, images, dtype), _split(n, 2 * threads))
        return out
    return _pointwise_images(w2, wa, b, x3, None, (0, n), dtype).reshape(n, co, h, wd)


def _pointwise_images(w2, wa, b, x3, out3, images, dtype):
    """Images ``images`` of a pointwise convolution, into ``out3`` (or a new array)."""
    n0, n1 = images
    x3 = x3[n0:n1]
    target = None if out3 is None else out3[n0:n1]
    co, ci = w2.shape
    if b is None:
        return np.matmul(w2, x3, out=target)
    if co >= 2 * (ci + 1):
        # bias as an extra input channel of ones: copy the small input, not the big output
        xa = np.empty((n1 - n0, ci + 1, x3.shape[2]), dtype)
        xa[:, :ci] = x3
        xa[:, ci] = 1
        return np.matmul(wa, xa, out=target)
    y = np.matmul(w2, x3, out=target)
    np.add(y, b.astype(dtype, copy=False).reshape(co, 1), out=y)
    return y


# ---------------------------------------------------------------- depthwise --
_CHUNK = 1 << 15          # elements per chunk array (128 KiB of float32): acc, tmp, input stay in L2
_EXPAND_BELOW = 3000      # positions per channel below which weights are expanded per position
_CHUNK_IMAGES = 1 << 16   # elements per chunk when several images share one (small maps)
_CHUNK_PADDED = 1 << 16   # elements per chunk of the padded method (large maps, long rows)


def depthwise(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations,
              dtype) -> np.ndarray:
    """Depthwise 2-D convolution: ``x`` [N,C,H,W], ``w`` [C,1,kh,kw], one filter per channel.

    ``pads`` is (top, left, bottom, right).  Returns [N,C,Ho,Wo] of ``dtype``.
    """
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    if 0 < ho * wo < _EXPAND_BELOW:
        source, same_pads = x, pads
        if (ho * sh != h or wo * sw != wd) and not any(pads):
            # a "valid" convolution of an input padded beforehand (an explicit Pad op, as in
            # EfficientNet): when the extra border is zero, it is a "same" one of the interior
            split = _zero_border(x, h - ho * sh, wd - wo * sw)
            if split is not None:
                top, left, bottom, right = split
                source, same_pads = x[:, :, top:h - bottom, left:wd - right], split
        if ho * sh == source.shape[2] and wo * sw == source.shape[3]:
            out = _depthwise_same(source, w, b, same_pads, strides, dilations, dtype, ho, wo)
            if out is not None:
                return out
    return _depthwise_padded(x, w, b, pads, strides, dilations, dtype)


def _zero_border(x: np.ndarray, rows: int, cols: int):
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

    threads = num_threads()
    if n >= threads or len(blocks) < 2:
        jobs = [(images, (0, len(blocks))) for images in _split(n, threads)]
    else:
        jobs = [((0, n), part) for part in _split(len(blocks), threads)]
    parallel(run, jobs)
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

    threads = num_threads()
    if n >= threads or len(blocks) < 2:
        jobs = [(images, (0, len(blocks))) for images in _split(n, threads)]
    else:
        jobs = [((0, n), part) for part in _split(len(blocks), threads)]
    parallel(run, jobs)
    return out


# ------------------------------------------------------------------- im2col --
_PATCH_BYTES = 2 << 20    # patch matrix per chunk of images (per thread): about the size of L2
_CHANNELS_LAST_MIN = 8    # channels per group from which patches are built channels-last


def _view(base: np.ndarray, shape, strides) -> np.ndarray:
    """A writable view of ``base`` (never a copy: patches are written through it)."""
    return as_strided(base, shape=tuple(shape), strides=tuple(strides))


def im2col(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations,
           group: int, dtype) -> np.ndarray:
    """General 2-D convolution by patch matrix + GEMM: ``x`` [N,Ci,H,W], ``w`` [Co,Ci/group,kh,kw].

    Images are processed a few at a time (so that the padded input, the patch
    matrix and the GEMM's output chunk stay in cache), on the thread pool.
    The bias rides in the GEMM as a patch row (or column) of ones.
    """
    n, ci, h, wd = x.shape
    co, cg, kh, kw = w.shape
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    hp, wp = h + pt + pb, wd + pl + pr
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    ho, wo = (hp - eh) // sh + 1, (wp - ew) // sw + 1
    out = np.empty((n, co, max(ho, 0), max(wo, 0)), dtype)
    if out.size == 0:
        return out
    cog = co // group
    k = cg * kh * kw
    kb = k + (b is not None)           # + a row of ones for the bias
    positions = ho * wo
    channels_last = cg >= _CHANNELS_LAST_MIN
    wmats = np.empty((group, cog, kb), dtype)
    if channels_last:
        wmats[:, :, :k] = w.reshape(group, cog, cg, kh, kw).transpose(0, 1, 3, 4, 2).reshape(group, cog, k)
    else:
        wmats[:, :, :k] = w.reshape(group, cog, k)
    if b is not None:
        wmats[:, :, k] = b.reshape(group, cog)
    itemsize = np.dtype(dtype).itemsize
    step = max(1, min(n, _PATCH_BYTES // max(kb * positions * itemsize, 1)))
    padded = bool(pt or pl or pb or pr) or channels_last
    out3 = out.reshape(n, co, positions)

    def run(images):
        n0, n1 = images
        m_max = min(step, n1 - n0)
        if channels_last:
            xp = np.zeros((m_max, hp, wp, ci), dtype)
            patches = np.empty((m_max, positions, kb), dtype)
            if b is not None:
                patches[:, :, k] = 1
            pstr = patches.strides
        else:
            xp = np.zeros((m_max, ci, hp, wp), dtype) if padded else None
            patches = np.empty((m_max, kb, positions), dtype)
            if b is not None:
                patches[:, k] = 1
            pstr = patches.strides
        for c0 in range(n0, n1, step):
            c1 = min(n1, c0 + step)
            m = c1 - c0
            if channels_last:
                xp[:m, pt:pt + h, pl:pl + wd, :] = x[c0:c1].transpose(0, 2, 3, 1)
                windows = sliding_window_view(xp[:m], (eh, ew), axis=(1, 2))[:, ::sh, ::sw, :, ::dh, ::dw]
                windows = windows[:, :ho, :wo].transpose(0, 1, 2, 4, 5, 3)   # [m, ho, wo, kh, kw, C]
                target = _view(patches, (m, ho, wo, kh, kw, cg),
                               (pstr[0], wo * pstr[1], pstr[1], kw * cg * itemsize, cg * itemsize, itemsize))
                for g in range(group):
                    target[...] = windows[..., g * cg:(g + 1) * cg]
                    np.matmul(wmats[g], patches[:m].transpose(0, 2, 1), out=out3[c0:c1, g * cog:(g + 1) * cog])
            else:
                if padded:
                    xp[:m, :, pt:pt + h, pl:pl + wd] = x[c0:c1]
                    source = xp[:m]
                else:
                    source = x[c0:c1]
                windows = sliding_window_view(source, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
                windows = windows[:, :, :ho, :wo].transpose(0, 1, 4, 5, 2, 3)  # [m, C, kh, kw, ho, wo]
                target = _view(patches, (m, cg, kh, kw, ho, wo),
                               (pstr[0], kh * kw * pstr[1], kw * pstr[1], pstr[1], wo * itemsize, itemsize))
                for g in range(group):
                    target[...] = windows[:, g * cg:(g + 1) * cg]
                    np.matmul(wmats[g], patches[:m], out=out3[c0:c1, g * cog:(g + 1) * cog])

    parallel(run, _split(n, num_threads()))
    return out
