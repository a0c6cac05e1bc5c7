"""Kernels of the conv family: Conv and ConvTranspose, 1-D to 3-D, NCHW-shaped in and out.

Conv supports groups, strides, dilations, explicit pads and every ``auto_pad``
mode, with or without bias.  2-D convolutions (and 1-D ones, run as 2-D with
a unit height) take one of the fast paths: depthwise by tap groups and 1x1 of
a channels-last input in ``_conv_channels_last`` (results stored channels-last,
see ``_conv2d``), the NCHW depthwise kernels of ``_conv_depthwise`` for the
geometries those do not cover, a plain GEMM for 1x1 of an NCHW input and a
patch matrix + GEMM otherwise (``_conv_fast``).  Higher ranks use a generic
patch matrix.  ConvTranspose is a GEMM followed by a strided scatter-add
(col2im), or one convolution per output phase.  The Conv kernel takes an
``epilogue`` (a fused Relu/Clip) and the ``extra_pads`` of a folded Pad.

Float16 inputs are computed in float32 and cast back; float32 and float64
stay in their own precision.  Summation order differs from onnxruntime, so
results agree to float32 rounding (about 1e-6 relative), not bit for bit.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import _conv_channels_last, _conv_depthwise, _conv_fast, _threads
from .base import Kernel, attribute, unsupported

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _ints(value) -> list[int] | None:
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def _auto_pad(op) -> str:
    mode = attribute(op, "auto_pad", "NOTSET")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in _AUTO_PADS:
        raise unsupported(op, f"auto_pad {mode!r} (expected one of {', '.join(_AUTO_PADS)})")
    return mode


def _compute_dtype(x: np.ndarray):
    if x.dtype in (np.float32, np.float64):
        return x.dtype
    if np.issubdtype(x.dtype, np.floating):
        return np.dtype(np.float32)
    raise TypeError(f"convolution of a {x.dtype} tensor: only floating-point inputs are supported")


def _per_axis(op, name: str, values, rank: int, default: int) -> list[int]:
    if values is None:
        return [default] * rank
    if len(values) != rank:
        raise unsupported(op, f"{name} has {len(values)} values for a {rank}-D convolution")
    return list(values)


class _Attributes:
    """The attributes shared by Conv and ConvTranspose, parsed once at build time."""

    def __init__(self, op):
        self.op = op
        self.auto_pad = _auto_pad(op)
        self.group = int(attribute(op, "group", 1))
        if self.group < 1:
            raise unsupported(op, f"group {self.group}")
        self.kernel_shape = _ints(attribute(op, "kernel_shape", None))
        self.strides = _ints(attribute(op, "strides", None))
        self.dilations = _ints(attribute(op, "dilations", None))
        self.pads = _ints(attribute(op, "pads", None))
        for name in ("strides", "dilations"):
            values = getattr(self, name)
            if values is not None and any(v < 1 for v in values):
                raise unsupported(op, f"{name} {values} (must be positive)")
        if self.pads is not None and (len(self.pads) % 2 or any(p < 0 for p in self.pads)):
            raise unsupported(op, f"pads {self.pads} (need 2 non-negative values per spatial axis)")

    def resolve(self, x: np.ndarray, w: np.ndarray, transposed: bool = False):
        """Check shapes; return (rank, kernel, strides, dilations)."""
        op = self.op
        if x.ndim < 3 or w.ndim != x.ndim:
            raise unsupported(op, f"input of rank {x.ndim} with weight of rank {w.ndim} "
                                  "(need [N, C, spatial...] and a weight of the same rank)")
        rank = x.ndim - 2
        if rank > 3:
            raise unsupported(op, f"{rank}-D convolution (1-D to 3-D are supported)")
        kernel = list(w.shape[2:])
        if self.kernel_shape is not None and list(self.kernel_shape) != kernel:
            raise unsupported(op, f"kernel_shape {self.kernel_shape} differs from the weight's {kernel}")
        strides = _per_axis(op, "strides", self.strides, rank, 1)
        dilations = _per_axis(op, "dilations", self.dilations, rank, 1)
        channels = x.shape[1]
        if transposed:
            if channels != w.shape[0] or channels % self.group:
                raise unsupported(op, f"{channels} input channels with a weight of shape {list(w.shape)} "
                                      f"and group {self.group}")
        elif channels != w.shape[1] * self.group or w.shape[0] % self.group:
            raise unsupported(op, f"{channels} input channels with a weight of shape {list(w.shape)} "
                                  f"and group {self.group}")
        return rank, kernel, strides, dilations


def _conv_pads(attrs: _Attributes, spatial, kernel, strides, dilations) -> tuple[list, list]:
    """Begin and end padding of every spatial axis."""
    rank = len(spatial)
    if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            begin.append(small if attrs.auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return begin, end
    if attrs.auto_pad == "VALID" or attrs.pads is None:
        return [0] * rank, [0] * rank
    if len(attrs.pads) != 2 * rank:
        raise unsupported(attrs.op, f"pads {attrs.pads} for a {rank}-D convolution")
    return list(attrs.pads[:rank]), list(attrs.pads[rank:])


def conv2d_geometry(op, x_shape, w_shape) -> tuple:
    """((top, left, bottom, right) pads, strides, dilations) with which the 2-D Conv ``op`` runs on an input
    of ``x_shape`` with a weight of ``w_shape``."""
    attrs = _Attributes(op)
    kernel = list(w_shape[2:])
    strides = _per_axis(op, "strides", attrs.strides, 2, 1)
    dilations = _per_axis(op, "dilations", attrs.dilations, 2, 1)
    begin, end = _conv_pads(attrs, list(x_shape[2:]), kernel, strides, dilations)
    return (begin[0], begin[1], end[0], end[1]), strides, dilations


# --------------------------------------------------------------------- Conv --
def _conv2d(x, w, b, pads, strides, dilations, group, dtype, epilogue=None) -> np.ndarray:
    """2-D convolution: pads is (top, left, bottom, right); ``epilogue`` (elementwise, in place) applied
    to the result, block by block where the path allows (None: none).

    Layout (see ``_conv_channels_last``): a depthwise result is stored channels-last (its fast paths
    compute that way), a 1x1 one in its input's layout (so a depthwise-pointwise stack never
    transposes), any other NCHW (a GEMM of patches writes NCHW fastest).
    """
    ci = x.shape[1]
    co, cg, kh, kw = w.shape
    if group == 1 and kh == 1 and kw == 1:
        if any(pads):
            x = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
        if strides[0] > 1 or strides[1] > 1:
            x = x[:, :, ::strides[0], ::strides[1]]
        if _conv_channels_last.is_channels_last(x):
            return _conv_channels_last.pointwise(x, w, b, dtype, epilogue)
        return _finished(_conv_fast.pointwise(x, w, b, dtype), epilogue)
    if ci == 1 and group == 1:   # one input channel (a waveform, a grey image): one GEMM of its patches, where
        # the depthwise path would repeat the input per output channel and loop over the taps (an STFT's 512:
        # 50x slower), and the im2col path's blocks are too thin to pay (10 taps: 15x slower)
        return _finished(_conv_nd(x, w, b, pads[:2], pads[2:], strides, dilations, 1, dtype), epilogue)
    if group == ci and cg == 1:
        if co != ci:  # channel multiplier: output channel o reads input channel o // (co / ci)
            x = np.repeat(x, co // ci, axis=1)
        out = _conv_channels_last.depthwise(x, w, b, pads, strides, dilations, dtype, epilogue)
        if out is not None:
            return out
        return _finished(_conv_depthwise.depthwise(x, w, b, pads, strides, dilations, dtype), epilogue)
    return _conv_fast.im2col(x, w, b, pads, strides, dilations, group, dtype, epilogue)


def _finished(y: np.ndarray, epilogue) -> np.ndarray:
    """``y`` after ``epilogue(y)`` (in place, channels along axis 1; None: as it is)."""
    _conv_fast.finish_channels_first(y, epilogue)
    return y


def _conv_nd(x, w, b, begin, end, strides, dilations, group, dtype) -> np.ndarray:
    """Any-rank convolution by patch matrix (channels first) and one GEMM per group."""
    n, ci = x.shape[:2]
    rank = x.ndim - 2
    co, cg = w.shape[:2]
    kernel = w.shape[2:]
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end))) if any(begin) or any(end) else x
    outs = [(size - e) // s + 1 for size, e, s in zip(xp.shape[2:], extents, strides)]
    out = np.empty((n, co, *[max(o, 0) for o in outs]), dtype)
    if out.size == 0:
        return out
    windows = sliding_window_view(xp, extents, axis=tuple(range(2, 2 + rank)))
    windows = windows[(slice(None), slice(None))
                      + tuple(slice(None, o * s, s) for o, s in zip(outs, strides))
                      + tuple(slice(None, None, d) for d in dilations)]
    order = (0, 1) + tuple(range(2 + rank, 2 + 2 * rank)) + tuple(range(2, 2 + rank))
    windows = windows.transpose(order)                     # [N, C, *kernel, *out]
    cog = co // group
    k = cg * int(np.prod(kernel))
    positions = int(np.prod(outs))
    out3 = out.reshape(n, co, positions)
    wmat = w.reshape(co, k).astype(dtype, copy=False)
    for g in range(group):
        patches = np.ascontiguousarray(windows[:, g * cg:(g + 1) * cg], dtype=dtype).reshape(n, k, positions)
        np.matmul(wmat[g * cog:(g + 1) * cog], patches, out=out3[:, g * cog:(g + 1) * cog])
    if b is not None:
        np.add(out3, b.astype(dtype, copy=False).reshape(co, 1), out=out3)
    return out


def _build_conv(op, opset: int) -> Kernel:
    attrs = _Attributes(op)

    def kernel(inputs, epilogue=None, extra_pads=None):
        """``epilogue``: elementwise work on the result, in place (a fused Relu/Clip), done
        block by block while a block is in cache where a path can.  ``extra_pads``:
        zero padding of the input (spatial begins, then ends) that a Pad folded into this convolution
        left to it."""
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        rank, ks, strides, dilations = attrs.resolve(x, w)
        if b is not None and b.shape != (w.shape[0],):
            raise unsupported(op, f"bias of shape {list(b.shape)} for {w.shape[0]} output channels")
        begin, end = _conv_pads(attrs, x.shape[2:], ks, strides, dilations)
        if extra_pads is not None:
            begin = [p + q for p, q in zip(begin, extra_pads[:rank])]
            end = [p + q for p, q in zip(end, extra_pads[rank:])]
        dtype = _compute_dtype(x)
        inner = epilogue if dtype == x.dtype else None   # float16: after the cast back, as it would be
        if rank == 1:
            y = _conv2d(x[:, :, None, :], w[:, :, None, :], b, (0, begin[0], 0, end[0]),
                        (1, strides[0]), (1, dilations[0]), attrs.group, dtype, inner)[:, :, 0, :]
        elif rank == 2:
            y = _conv2d(x, w, b, (begin[0], begin[1], end[0], end[1]), strides, dilations, attrs.group, dtype,
                        inner)
        else:
            y = _finished(_conv_nd(x, w, b, begin, end, strides, dilations, attrs.group, dtype), inner)
        if inner is None and epilogue is not None:
            return [_finished(y.astype(x.dtype), epilogue)]
        return [y.astype(x.dtype, copy=False)]
    kernel.takes_epilogue = True
    return kernel


# ------------------------------------------------------------ ConvTranspose --
def _build_conv_transpose(op, opset: int) -> Kernel:
    attrs = _Attributes(op)
    output_padding = _ints(attribute(op, "output_padding", None))
    output_shape = _ints(attribute(op, "output_shape", None))

    def kernel(inputs):
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        rank, ks, strides, dilations = attrs.resolve(x, w, transposed=True)
        group = attrs.group
        n, ci = x.shape[:2]
        cog = w.shape[1]
        co = cog * group
        if b is not None and b.shape != (co,):
            raise unsupported(op, f"bias of shape {list(b.shape)} for {co} output channels")
        spatial = list(x.shape[2:])
        adjust = _per_axis(op, "output_padding", output_padding, rank, 0)
        # extent of the full (uncropped) result along each axis
        full = [s * (i - 1) + a + (k - 1) * d + 1 for i, s, a, k, d in zip(spatial, strides, adjust, ks, dilations)]
        begin, sizes = _transpose_geometry(attrs, op, output_shape, spatial, full, strides, rank)
        dtype = _compute_dtype(x)
        cig = ci // group
        positions = int(np.prod(spatial))
        taps = int(np.prod(ks))
        phases = _phase_plan(rank, ks, strides, dilations, adjust, begin, sizes, spatial)
        if phases is not None:
            out = _transpose_by_phases(np.ascontiguousarray(x, dtype=dtype), w.astype(dtype, copy=False),
                                       None if b is None else b.astype(dtype, copy=False), strides, group,
                                       sizes, phases)
            return [out.astype(x.dtype, copy=False)]
        buffer = _transpose_by_scatter(x.reshape(n, ci, positions).astype(dtype, copy=False), w, group, ks,
                                       strides, dilations, spatial, full, dtype)
        out = np.zeros((n, co, *sizes), dtype)
        source, dest = [], []
        for start, size, extent in zip(begin, sizes, full):
            lo, hi = max(start, 0), min(start + size, extent)
            source.append(slice(lo, max(hi, lo)))
            dest.append(slice(lo - start, lo - start + max(hi - lo, 0)))
        out[(slice(None), slice(None)) + tuple(dest)] = buffer[(slice(None), slice(None)) + tuple(source)]
        if b is not None:
            out += b.astype(dtype, copy=False).reshape((co,) + (1,) * rank)
        return [out.astype(x.dtype, copy=False)]
    return kernel


def _phase_pads(size: int, begin: int, stride: int, taps: int, extent: int, phase: int):
    """For output phase ``phase`` (outputs phase, phase + stride, ...) of a cropped ConvTranspose axis:
    (kernel phase, pad before, pad after) of the ordinary convolution that computes exactly those
    outputs, or None when a pad would be negative.  Output o is full index o + begin, whose kernel
    phase is (o + begin) % stride, at step (o + begin) // stride of that phase's convolution, which
    starts ``taps`` - 1 positions before the input."""
    count = -(-(size - phase) // stride)
    first = (phase + begin) // stride
    before = taps - 1 - first
    after = count - extent - before + taps - 1
    return ((phase + begin) % stride, before, after) if before >= 0 and after >= 0 and count > 0 else None


def _phase_plan(rank, ks, strides, dilations, adjust, begin, sizes, spatial) -> list | None:
    """Per axis, per output phase, ``_phase_pads``: when the sub-pixel form applies (2-D, no dilation or
    output padding, each kernel side a multiple of its stride: 4x4 stride 2, 2x2 stride 2, ..., and a
    crop it can express as padding); else None."""
    if rank != 2 or any(d != 1 for d in dilations) or any(adjust) or any(k % s for k, s in zip(ks, strides)):
        return None
    plan = [[_phase_pads(size, start, s, k // s, extent, phase) for phase in range(s)]
            for size, start, s, k, extent in zip(sizes, begin, strides, ks, spatial)]
    return None if any(pads is None for axis in plan for pads in axis) else plan


def _transpose_by_phases(x: np.ndarray, w: np.ndarray, b, strides, group: int, sizes, plan) -> np.ndarray:
    """A 2-D ConvTranspose (kernel sides multiples of the strides) as s_h * s_w ordinary convolutions.

    The full output's phase (p, q), full[s_h u + p, s_w v + q], sums x[u - a, v - b] w[p + s_h a,
    q + s_w b] over a < m_h = k_h / s_h, b < m_w: a convolution (cross-correlation) of x, padded by
    m - 1, with the kernel w[p::s_h, q::s_w] reversed.  The crop becomes padding (``plan``, from
    ``_phase_plan``) and the bias rides in each GEMM, so every output phase is written once, by the
    fast im2col path (patches in cache, on the threads); no column matrix is scattered.
    """
    n, ci = x.shape[:2]
    (sh, sw), (kh, kw) = strides, w.shape[2:]
    cig, cog = ci // group, w.shape[1]
    # as a Conv weight [Co, Ci/group, kh, kw]
    forward = w.reshape(group, cig, cog, kh, kw).transpose(0, 2, 1, 3, 4).reshape(group * cog, cig, kh, kw)
    out = np.empty((n, group * cog, *sizes), x.dtype)
    for r, (p, top, bottom) in enumerate(plan[0]):
        for c, (q, left, right) in enumerate(plan[1]):
            kernel = np.ascontiguousarray(forward[:, :, p::sh, q::sw][:, :, ::-1, ::-1])
            if kernel.shape[2:] == (1, 1) and not (top or left or bottom or right) and group > 1:
                # kernel = stride (a 2x2 stride-2 upsampling per channel group): each phase is a grouped 1x1
                # product, which im2col would run as one tiny GEMM per group
                if cig == cog == 1:   # depthwise: a scale per channel
                    phase = x * kernel.reshape(1, group, 1, 1)
                else:
                    phase = np.matmul(kernel.reshape(group, cog, cig),
                                      x.reshape(n, group, cig, -1)).reshape(n, group * cog, *x.shape[2:])
                if b is not None:
                    phase += b.reshape(1, -1, 1, 1)
                out[:, :, r::sh, c::sw] = phase
                continue
            out[:, :, r::sh, c::sw] = _conv_fast.im2col(x, kernel, b, (top, left, bottom, right), (1, 1), (1, 1),
                                                        group, x.dtype)
    return out


def _transpose_by_scatter(x3, w, group, ks, strides, dilations, spatial, full, dtype) -> np.ndarray:
    """Any ConvTranspose: one GEMM per group giving every tap's contribution (columns), added into the
    full output at the tap's strided offsets (col2im)."""
    n = x3.shape[0]
    cig, cog = x3.shape[1] // group, w.shape[1]
    co, taps = cog * group, int(np.prod(ks))
    buffer = np.zeros((n, co, *[max(f, 1) for f in full]), dtype)
    weights = [w[g * cig:(g + 1) * cig].reshape(cig, cog * taps).astype(dtype, copy=False).T
               for g in range(group)]

    def scatter(images):   # images [n0, n1): their GEMMs, and the taps added into the buffer
        n0, n1 = images
        for g in range(group):
            cols = np.matmul(weights[g], x3[n0:n1, g * cig:(g + 1) * cig])   # [n, cog*taps, positions]
            cols = cols.reshape(n1 - n0, cog, *ks, *spatial)
            for index in itertools.product(*[range(k) for k in ks]):
                target = tuple(slice(j * d, j * d + s * (i - 1) + 1, s)
                               for j, d, s, i in zip(index, dilations, strides, spatial))
                region = buffer[(slice(n0, n1), slice(g * cog, (g + 1) * cog)) + target]
                np.add(region, cols[(slice(None), slice(None)) + index], out=region)

    _threads.parallel(scatter, _threads.split_evenly(n, _threads.num_threads()))
    return buffer


def _transpose_geometry(attrs, op, output_shape, spatial, full, strides, rank):
    """Crop start and output size along each axis of a ConvTranspose (onnxruntime's rules)."""
    if output_shape is not None or attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            if len(output_shape) < rank:
                raise unsupported(op, f"output_shape {output_shape} for a {rank}-D ConvTranspose")
            sizes = list(output_shape[-rank:])
        else:
            sizes = [i * s for i, s in zip(spatial, strides)]
        begin = []
        for size, extent in zip(sizes, full):
            total = max(0, extent - size)
            if attrs.auto_pad == "SAME_UPPER":
                begin.append(total // 2)
            else:
                begin.append(total - total // 2)
        return begin, sizes
    if attrs.auto_pad == "VALID" or attrs.pads is None:
        return [0] * rank, list(full)
    if len(attrs.pads) != 2 * rank:
        raise unsupported(op, f"pads {attrs.pads} for a {rank}-D ConvTranspose")
    begin, end = attrs.pads[:rank], attrs.pads[rank:]
    return list(begin), [f - bb - e for f, bb, e in zip(full, begin, end)]


KERNELS: dict = {
    "Conv": _build_conv,
    "ConvTranspose": _build_conv_transpose,
}
