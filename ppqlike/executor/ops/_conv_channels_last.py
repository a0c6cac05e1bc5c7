"""Channels-last 2-D convolution: activations stored [N, H, W, C] in memory, seen as NCHW.

A channels-last result is handed on as ``array.transpose(0, 3, 1, 2)``: an
NCHW-shaped view whose channels are its innermost, contiguous axis.  Every op
sees the usual NCHW shape (numpy's semantics do not depend on memory order);
the conv kernels recognise the layout (``is_channels_last``) and skip the
transposes a conv stack would otherwise pay at each layer:

* ``pointwise`` - 1x1: one GEMM ``X[rows, Ci] @ W[Ci, Co]`` per group of
  whole images, the groups on the kernel threads.
* ``depthwise`` - one filter per channel.  When the output grid is the input's
  stride-phase grid ("same" padding, H and W multiples of the stride) the
  image is copied into a flat buffer, each row split into its column stride
  phases; every tap of a column phase is a constant shift of that buffer, so
  all taps of a phase are one ``einsum`` over output rows of ``Wo * C``
  contiguous elements (numpy's fused multiply-add loop, one pass per tap; the
  shifted reads that wrap into the neighbouring row are cancelled by zeros in
  the per-column weights, rows beyond the border read zero margins).
  MobileNetV2's 112x112x32 layer: 3.2 ms an image with a per-position einsum,
  1.0 ms this way.  Other geometries: one einsum per image over a zero-padded
  copy.
* a 1x1 convolution and the depthwise one reading it, run together:
  ``_conv_expand_chain.expand_then_depthwise`` (built on the two above).

Each block of a result gets its bias and the kernel's ``epilogue`` (a fused
Relu/Clip) while it is in cache.  The GEMM matrices and tap weights made from
constant parameters are kept across calls (``_prepared``).  Inputs are never written.  Results are fresh
channels-last arrays.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._conv_depthwise import same_geometry
from ._prepared import prepared
from ._threads import parallel_items

_ROWS_BLOCK = 1 << 19       # output elements per block of a depthwise convolution: few, long numpy calls
                            # (each costs ~10 us and a hand-over of the GIL between the kernel threads)
_POINTWISE_BLOCK = 1 << 18  # output elements per GEMM of a 1x1 convolution
_POINTWISE_GROUPS = 8       # a 1x1 convolution of a batch is cut into at least this many GEMMs (fewer
                            # images): the kernel threads get balanced work on small maps.  A constant, not
                            # the thread count: OpenBLAS's sums depend on the cuts, results must not
_WINDOWS_MIN_CHANNELS = 64  # another geometry runs channels-last (one einsum per image) from this many
_WINDOWS_MAX_MAP = 60 * 60  # channels, on maps of at most this many positions


def is_channels_last(x: np.ndarray) -> bool:
    """Whether ``x`` (4-D, NCHW-shaped) is stored channels-last: ``x.transpose(0, 2, 3, 1)`` is contiguous."""
    return x.ndim == 4 and x.transpose(0, 2, 3, 1).flags.c_contiguous


def finish(block: np.ndarray, bias: np.ndarray | None, epilogue) -> None:
    """The end of a block of output, in place, while it is in cache: + ``bias`` (broadcast along the last
    axis), then ``epilogue(block)`` (elementwise work the executor hands the kernel: a fused Relu/Clip;
    None: nothing).  An epilogue also takes ``epilogue(block, out)``: the same work written into ``out``.
    Every block handed to an epilogue holds whole pixels along its last axis, channels fastest (an epilogue
    that reads channels relies on that; channels-first blocks reach its ``channels_first`` through
    ``_conv_fast.finish_channels_first``)."""
    if bias is not None:
        np.add(block, bias, out=block)
    if epilogue is not None:
        epilogue(block)


def _rows_per_block(row: int) -> int:
    return max(1, _ROWS_BLOCK // max(row, 1))


# ---------------------------------------------------------------- pointwise --
def pointwise(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, dtype, epilogue=None) -> np.ndarray:
    """1x1 convolution, stride 1, no padding, one group, of a channels-last ``x`` [N,Ci,H,W]; ``w`` [Co,Ci,1,1].

    out[p, :] = x[p, :] @ W^T + b for every position p: one GEMM per group of whole images (``_Gemm``),
    the groups on the threads, ``epilogue`` (see ``finish``) applied to each group's rows.
    """
    n, ci, h, wd = x.shape
    co = w.shape[0]
    gemm = _Gemm(w, b, h * wd, n, dtype)
    source = x.transpose(0, 2, 3, 1).reshape(n, h * wd, ci)
    out = np.empty((n, h, wd, co), dtype)
    target = out.reshape(n, h * wd, co)
    groups = gemm.groups(n)

    def run(group, inputs):
        i0, i1 = groups[group]
        gemm.run(source[i0:i1].reshape(-1, ci), target[i0:i1].reshape(-1, co), inputs, epilogue)

    parallel_items(run, len(groups), gemm.inputs)
    return out.transpose(0, 3, 1, 2)


def _gemm_weight(w: np.ndarray, b: np.ndarray | None, dtype) -> np.ndarray:
    """The GEMM matrix of a 1x1 convolution: ``w`` [Co,Ci,1,1] as [Ci, Co], ``b`` (when given) an extra last
    row."""
    co, ci = w.shape[:2]
    weight = np.empty((ci + (b is not None), co), dtype)
    weight[:ci] = w.reshape(co, ci).T
    if b is not None:
        weight[ci] = b
    return weight


class _Gemm:
    """The GEMMs of a 1x1 convolution over ``n`` channels-last images: one per group of whole images (about
    ``_POINTWISE_BLOCK`` output elements, at least ``_POINTWISE_GROUPS`` groups when there are as many
    images), so that ``pointwise`` and ``expand_then_depthwise`` make the
    same BLAS calls (OpenBLAS's sums depend on how the rows are cut) and agree bit for bit.  When the
    output is much wider than the input the bias rides in the GEMM (the input rows copied beside a column
    of ones: cheaper than a pass over the output)."""

    def __init__(self, w: np.ndarray, b: np.ndarray | None, positions: int, n: int, dtype):
        co, ci = w.shape[:2]
        self.augmented = b is not None and co >= 2 * (ci + 1)
        self.weight = prepared(lambda: _gemm_weight(w, b if self.augmented else None, dtype),
                               ("gemm weight", np.dtype(dtype).str, self.augmented), (w, b))
        self.bias = None if b is None or self.augmented else b.astype(dtype, copy=False)
        self.images = max(1, min(_POINTWISE_BLOCK // max(positions * co, 1), -(-n // _POINTWISE_GROUPS)))
        self.rows, self.ci, self.co, self.dtype = self.images * positions, ci, co, dtype

    def groups(self, n: int) -> list:
        return [(i, min(n, i + self.images)) for i in range(0, n, self.images)]

    def inputs(self) -> np.ndarray | None:
        """A thread's buffer of input rows beside a column of ones (None when the bias is added apart)."""
        if not self.augmented:
            return None
        inputs = np.empty((self.rows, self.ci + 1), self.dtype)
        inputs[:, self.ci] = 1
        return inputs

    def run(self, source: np.ndarray, target: np.ndarray, inputs, epilogue) -> None:
        """target = source @ W^T + b, then ``epilogue``; rows of one group of images."""
        if inputs is not None:
            inputs = inputs[:len(source)]
            inputs[:, :self.ci] = source
            np.matmul(inputs, self.weight, out=target)
        else:
            np.matmul(source, self.weight, out=target)
        finish(target, self.bias, epilogue)


# ---------------------------------------------------------------- depthwise --
def depthwise(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads, strides, dilations, dtype,
              epilogue=None) -> np.ndarray | None:
    """Depthwise convolution of ``x`` [N,C,H,W] (any layout; channels-last is read without a transpose),
    ``w`` [C,1,kh,kw]; ``pads`` (top, left, bottom, right).  Returns [N,C,Ho,Wo] stored channels-last, or
    None for a geometry this module does not cover well (large maps of a "valid" convolution).

    A "valid" convolution of an input whose extra border is zero (an explicit Pad before it) is run as
    a "same" one of the interior, as the convolution with the Pad folded into it runs.
    """
    c, h, wd = x.shape[1:]
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        return None
    same = same_geometry(x, pads, strides, ho, wo)
    if same is not None:
        out = _depthwise_phases(same[0], w, b, same[1], strides, dilations, dtype, epilogue)
        if out is not None:
            return out
    if c >= _WINDOWS_MIN_CHANNELS and h * wd <= _WINDOWS_MAX_MAP:
        return _depthwise_windows(x, w, b, pads, strides, dilations, dtype, ho, wo, epilogue)
    return None


def _tap_groups(kernel: int, stride: int, dilation: int, pad: int):
    """Taps of one axis grouped by the stride phase they read: [(phase, first shift, shift step, taps)].

    Tap ``a`` reads input row ``i * stride + a * dilation - pad`` for output row ``i``: phase
    ``(a * dilation - pad) % stride`` at shift ``(a * dilation - pad) // stride``.  The taps of one phase
    are an arithmetic progression, and so are their shifts.
    """
    groups = {}
    for a in range(kernel):
        offset = a * dilation - pad
        groups.setdefault(offset % stride, []).append((a, offset // stride))
    result = []
    for phase, members in sorted(groups.items()):
        taps = [a for a, _ in members]
        shifts = [s for _, s in members]
        step = shifts[1] - shifts[0] if len(shifts) > 1 else 1
        result.append((phase, shifts[0], step, taps))
    return result


class _TapGroups:
    """A depthwise convolution whose output grid is its input's phase grid, as groups of taps (see the
    module): the groups' per-column weights, and per thread a zero-margined buffer with the strided views
    every block of output rows reads.

    The buffer holds the image's rows whole, each row its column stride phases side by side ([H, sw, wo,
    C]): every tap of a column phase is then a constant shift of the buffer, the kernel's rows included
    (output row i reads input row i * sh + a * dh - pad for row tap a), so one group per column phase (one
    with stride 1, two with stride 2) holds all the row taps."""

    def __init__(self, c, h, wd, w, b, pads, strides, dilations, dtype):
        kh, kw = w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = strides, dilations
        ho, wo = h // sh, wd // sw
        row, line = wo * c, wd * c   # an output row, an input row (its sw phases)
        filters = w.reshape(c, kh, kw).astype(dtype, copy=False)
        columns = np.arange(wo)
        wrapped = np.zeros(wo, bool)   # output columns with a tap whose read wraps into another row
        groups = []   # (offset of the first tap, row step, column step, weights [kh, tb, row])
        for pb, dj, ddj, col_taps in _tap_groups(kw, sw, dw, pads[1]):
            weights = np.empty((kh, len(col_taps), wo, c), dtype)
            for ib, bb in enumerate(col_taps):
                shift = dj + ib * ddj
                inside = ((columns + shift >= 0) & (columns + shift < wo)).astype(dtype)
                wrapped |= inside == 0
                for a in range(kh):
                    np.multiply(inside[:, None], filters[:, a, bb], out=weights[a, ib])
            groups.append((-pads[0] * line + pb * row + dj * c, dh * line, ddj * c,
                           weights.reshape(kh, len(col_taps), row)))
        groups.sort(key=lambda g: -g[3].shape[1])   # the largest group writes the block first
        lowest = min(offset for offset, *_ in groups)   # the first and one past the last element read
        highest = max(offset + (kh - 1) * row_step + (weights.shape[1] - 1) * column_step + (ho - 1) * sh * line + row
                      for offset, row_step, column_step, weights in groups)
        self.groups, self.dtype, self.c, self.strides = groups, dtype, c, (sh, sw)
        self.h, self.ho, self.wo, self.row, self.line = h, ho, wo, row, line
        self.margin = max(0, -lowest, highest - h * line)
        first = int(np.argmin(wrapped)) if not wrapped.all() else wo   # wrapped columns: [0, first), [last, wo)
        last = wo - int(np.argmin(wrapped[::-1])) if not wrapped.all() else wo
        self.edges = [(0, first)] * (first > 0) + [(last, wo)] * (last < wo)
        self.bias = None if b is None else np.tile(b.astype(dtype, copy=False), wo)   # one output row's worth
        self.step = _rows_per_block(row)

    def workspace(self) -> tuple:
        """(the image's rows [H, sw, wo, C] in the buffer, blocks, scratch) of one thread; blocks: per block
        of output rows (r0, r1, [(taps view, spread weights) per group])."""
        margin, row, line, itemsize = self.margin, self.row, self.line, np.dtype(self.dtype).itemsize
        sh, sw = self.strides
        buffer = np.empty(margin + self.h * line + margin, self.dtype)
        buffer[:margin] = buffer[margin + self.h * line:] = 0   # the rows between: every ``fill`` writes them
        blocks = []
        for r0 in range(0, self.ho, self.step):
            r1 = min(self.ho, r0 + self.step)
            operands = []
            for offset, row_step, column_step, weights in self.groups:
                ta, tb = weights.shape[:2]
                start = margin + r0 * sh * line + offset
                operands.append((
                    np.ndarray((ta, tb, r1 - r0, row), self.dtype, buffer, start * itemsize,
                               (row_step * itemsize, column_step * itemsize, sh * line * itemsize, itemsize)),
                    np.ndarray((ta, tb, r1 - r0, row), self.dtype, weights, 0,
                               (tb * row * itemsize, row * itemsize, 0, itemsize))))
            blocks.append((r0, r1, operands))
        rows = buffer[margin:margin + self.h * line].reshape(self.h, sw, self.wo, self.c)
        return rows, blocks, np.empty((self.step, row), self.dtype)

    def fill(self, space: tuple, source: np.ndarray, epilogue=None) -> None:
        """Copy one image [H, W, C] into the buffer of ``space``, each row split into its column phases;
        through ``epilogue(values, out)`` (see ``finish``; it may overwrite ``source``) when given."""
        sw, rows = self.strides[1], space[0]
        if sw == 1:
            target, values = rows[:, 0], source
        else:
            target, values = rows, source.reshape(self.h, self.wo, sw, self.c).transpose(0, 2, 1, 3)
        if epilogue is None:
            target[...] = values
        elif sw == 1 and source.flags.c_contiguous and target.flags.c_contiguous:
            epilogue(values.reshape(self.h, -1), target.reshape(self.h, -1))   # rows of whole pixels: long runs
        elif getattr(epilogue, "single_pass", False) or not source.flags.c_contiguous:
            epilogue(values, target)   # (a clip writes the phases as it reads)
        else:   # passes in place on the image's rows (in cache), then the phases copied apart: one strided pass
            epilogue(source.reshape(self.h, -1))
            target[...] = values

    def compute(self, space: tuple, target: np.ndarray, epilogue) -> float:
        """The image in ``space``'s buffer convolved into ``target`` [ho, wo * c], bias and ``epilogue``
        applied; returns the sum of the outputs before them in the columns where a tap's read wraps into
        another row (NaN or inf when one of those is not finite: a zero weight cancels a wrapped read only
        when it is finite; the other columns read no wrapped value, so a NaN or inf there is the
        convolution's own)."""
        _, blocks, scratch = space
        total = 0.0
        with np.errstate(all="ignore"):
            for r0, r1, operands in blocks:
                block = target[r0:r1]
                partial = scratch[:r1 - r0]
                for index, (taps, spread) in enumerate(operands):
                    np.einsum("abrq,abrq->rq", taps, spread, out=block if index == 0 else partial)
                    if index:
                        np.add(block, partial, out=block)
                pixels = block.reshape(r1 - r0, self.wo, self.c)
                for first, end in self.edges:   # before the epilogue, which may hide NaN
                    total += float(np.add.reduce(pixels[:, first:end], axis=None))
                finish(block, self.bias, epilogue)
        return total


def _tap_groups_of(c, h, wd, w, b, pads, strides, dilations, dtype) -> "_TapGroups":
    """``_TapGroups(...)``, made once per geometry and constant weights (``_prepared``)."""
    key = ("tap groups", c, h, wd, tuple(pads), tuple(strides), tuple(dilations), np.dtype(dtype).str)
    return prepared(lambda: _TapGroups(c, h, wd, w, b, pads, strides, dilations, dtype), key, (w, b))


def _depthwise_phases(x, w, b, pads, strides, dilations, dtype, epilogue):
    """Depthwise convolution whose output grid is the input's phase grid, by tap groups (see the module).

    Returns None when an output is not finite: a zero weight cancels a wrapped read only when that
    read is finite, so an inf or NaN input is recomputed by ``_depthwise_windows``.
    """
    n, c, h, wd = x.shape
    plan = _tap_groups_of(c, h, wd, w, b, pads, strides, dilations, dtype)
    out = np.empty((n, plan.ho, plan.wo, c), dtype)
    totals = np.zeros(n)

    def run(image, space):
        plan.fill(space, x[image].transpose(1, 2, 0))                # [H, W, C], a view
        totals[image] = plan.compute(space, out[image].reshape(plan.ho, plan.row), epilogue)

    parallel_items(run, n, plan.workspace)
    return out.transpose(0, 3, 1, 2) if np.isfinite(totals).all() else None


def _depthwise_windows(x, w, b, pads, strides, dilations, dtype, ho, wo, epilogue):
    """Depthwise convolution of any geometry: per image, a zero-padded channels-last copy and one einsum
    of its strided windows [Ho, Wo, kh, kw, C] with the filters [kh, kw, C]."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dilations
    pt, pl, pb, pr = pads
    taps = np.ascontiguousarray(w.reshape(c, kh, kw).transpose(1, 2, 0), dtype=dtype)
    bias = None if b is None else b.astype(dtype, copy=False)
    out = np.empty((n, max(ho, 0), max(wo, 0), c), dtype)
    if out.size == 0:
        return out.transpose(0, 3, 1, 2)

    def workspace():
        padded = np.zeros((h + pt + pb, wd + pl + pr, c), dtype)
        rows, cols, channels = padded.strides
        return padded, as_strided(padded, shape=(ho, wo, kh, kw, c),
                                  strides=(rows * sh, cols * sw, rows * dh, cols * dw, channels))

    def run(image, space):
        padded, windows = space
        padded[pt:pt + h, pl:pl + wd] = x[image].transpose(1, 2, 0)
        np.einsum("hwijc,ijc->hwc", windows, taps, out=out[image])
        finish(out[image], bias, epilogue)

    parallel_items(run, n, workspace)
    return out.transpose(0, 3, 1, 2)
