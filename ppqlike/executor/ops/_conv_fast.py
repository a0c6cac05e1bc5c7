"""Fast numpy paths for 2-D convolution, shared by the conv family (see ``conv.py``).

Everything here takes NCHW-shaped arrays (any memory layout) and returns a fresh, C-ordered NCHW array;
inputs are never written.  Nothing is cached across calls: weights are
re-read (and re-laid-out, which is cheap next to the convolution) every call.

Two paths, chosen by ``conv.py`` (times below: batch 16 on a 2-vCPU AMD EPYC
VM, OpenBLAS pinned to its Haswell kernels, against onnxruntime 1.31 with 2
threads; see ``bench/executor_speed.py --per-layer``):

* ``pointwise`` - 1x1 convolution of an NCHW input (a channels-last one goes to
  ``_conv_channels_last``): one GEMM per image, ``W[Co,Ci] @ X[n]``,
  straight into the NCHW output; below ``_ONE_GEMM_BELOW`` positions (7x7
  maps) one GEMM for the whole batch.  The bias rides inside the GEMM as an
  input row of ones when the output is much wider than the input.  About as
  fast as onnxruntime (MobileNetV2's 34 layers: 27 ms vs 29 ms).
* ``im2col`` - everything else (dense k x k, grouped): a patch matrix built
  from a ``sliding_window_view`` and one GEMM per group, a few images at a
  time so that the patches stay in cache, the bias as a row of ones.
  Patches are channels-last (contiguous channel runs) when a group has at
  least ``_CHANNELS_LAST_MIN`` channels, else channels-first.

Threads: see ``_threads.py``; depthwise convolution: ``_conv_channels_last.py``
and ``_conv_depthwise.py``.
"""


from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from ._threads import num_threads, parallel, parallel_items, split_evenly

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
        parallel(lambda images: _pointwise_images(w2, wa, b, x3, out3, images, dtype), split_evenly(n, 2 * threads))
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


def finish_channels_first(block: np.ndarray, epilogue) -> None:
    """``epilogue(block)`` on a block whose channels lie along axis 1; an epilogue that reads channels (see
    ``_conv_channels_last.finish``) has a ``channels_first(block)`` of its own for such blocks."""
    if epilogue is not None:
        channels_first = getattr(epilogue, "channels_first", None)
        if channels_first is not None:
            channels_first(block)
        else:
            epilogue(block)


# ---------------------------------------------------------------- depthwise --
_PATCH_BYTES = 2 << 20    # patch matrix per chunk of images (per thread): about the size of L2
_CHANNELS_LAST_MIN = 8    # channels per group from which patches are built channels-last


def _view(base: np.ndarray, shape, strides) -> np.ndarray:
    """A writable view of ``base`` (never a copy: patches are written through it)."""
    return as_strided(base, shape=tuple(shape), strides=tuple(strides))


def im2col(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations,
           group: int, dtype, epilogue=None) -> np.ndarray:
    """General 2-D convolution by patch matrix + GEMM: ``x`` [N,Ci,H,W], ``w`` [Co,Ci/group,kh,kw].

    Images are processed a few at a time (so that the padded input, the patch
    matrix and the GEMM's output chunk stay in cache), on the thread pool.
    The bias rides in the GEMM as a patch row (or column) of ones; ``epilogue`` (elementwise, in place:
    a fused Relu/Clip) is applied to each chunk of output after its GEMM.
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
    # images a chunk: the patch matrix about L2's size, and at least two chunks a thread
    step = max(1, min(-(-n // (2 * num_threads())), _PATCH_BYTES // max(kb * positions * itemsize, 1)))
    padded = bool(pt or pl or pb or pr) or channels_last
    out3 = out.reshape(n, co, positions)

    chunks = [(c0, min(n, c0 + step)) for c0 in range(0, n, step)]

    def workspace():
        if channels_last:
            xp = np.zeros((step, hp, wp, ci), dtype)
            patches = np.empty((step, positions, kb), dtype)
            if b is not None:
                patches[:, :, k] = 1
        else:
            xp = np.zeros((step, ci, hp, wp), dtype) if padded else None
            patches = np.empty((step, kb, positions), dtype)
            if b is not None:
                patches[:, k] = 1
        return xp, patches

    def run(chunk, space):
        (c0, c1), (xp, patches) = chunks[chunk], space
        m, pstr = c1 - c0, patches.strides
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
        finish_channels_first(out3[c0:c1], epilogue)

    parallel_items(run, len(chunks), workspace)
    return out
