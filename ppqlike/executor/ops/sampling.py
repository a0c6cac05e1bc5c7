"""Kernels of the sampling family: GridSample (opsets 16 and 20), AffineGrid, Col2Im and DeformConv.

Ops that read an input at computed, possibly fractional positions.  Arithmetic stays in the input's
float dtype, as in onnxruntime, so that positions on pixel borders pick the same pixels.  Every
sample is gathered for all channels at once (flat indices into each image), corner by corner.
"""

from __future__ import annotations

import itertools

import numpy as np

from .base import Kernel, attribute, by_opset, unsupported


def _optional(inputs, index):
    return inputs[index] if index < len(inputs) else None


def _gather(images: np.ndarray, indices: list, valid) -> np.ndarray:
    """``images`` [N, C, *S] at integer positions ``indices`` (one [N, *P] array per spatial axis, inside
    the image) -> [N, C, *P]; positions where ``valid`` is False read 0."""
    n, c = images.shape[:2]
    sizes = images.shape[2:]
    flat = np.zeros(indices[0].shape, np.int64)
    for index, size in zip(indices, sizes):
        flat = flat * size + index
    points = flat.shape[1:]
    values = np.take_along_axis(images.reshape(n, c, -1), flat.reshape(n, 1, -1), axis=2)
    values = values.reshape((n, c) + points)
    if valid is not None:
        values = values * valid[:, None].astype(images.dtype)
    return values


# ------------------------------------------------------------------- GridSample --
def _denormalize(coordinate: np.ndarray, size: int, align_corners: bool) -> np.ndarray:
    dtype = coordinate.dtype.type
    if align_corners:      # [-1, 1] -> [0, size - 1]
        return (coordinate + dtype(1)) / dtype(2) * dtype(size - 1)
    return ((coordinate + dtype(1)) * dtype(size) - dtype(1)) / dtype(2)   # -> [-0.5, size - 0.5]


def _reflect(position: np.ndarray, low: float, high: float) -> np.ndarray:
    """Integer positions reflected at the borders [low, high] until inside (onnxruntime's rule)."""
    dtype = position.dtype.type
    low, high = dtype(low), dtype(high)
    span = high - low
    if span <= 0:
        return np.zeros_like(position)
    below, above = position < low, position > high
    distance = np.where(below, low - position, np.where(above, position - high, dtype(0)))
    folds = np.trunc(distance / span)
    rest = distance - folds * span
    even = np.fmod(folds, 2) == 0
    from_low, from_high = low + rest, high - rest
    reflected = np.where(below, np.where(even, from_low, from_high), np.where(above, np.where(even, from_high,
                                                                                                from_low), position))
    return np.trunc(reflected)


def _pad_indices(indices: list, sizes, padding: str, align_corners: bool, dtype):
    """Integer positions made readable: (indices, valid mask or None)."""
    if padding == "zeros":
        valid = np.ones(indices[0].shape, bool)
        for index, size in zip(indices, sizes):
            valid &= (index >= 0) & (index < size)
        return [np.clip(index, 0, size - 1) for index, size in zip(indices, sizes)], valid
    if padding == "border":
        return [np.clip(index, 0, size - 1) for index, size in zip(indices, sizes)], None
    result = []
    for index, size in zip(indices, sizes):
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        reflected = _reflect(index.astype(dtype), low, high).astype(np.int64)
        result.append(np.clip(reflected, 0, size - 1))
    return result, None


def _cubic_coefficients(t: np.ndarray) -> list:
    """Keys cubic convolution weights (a = -0.75) of the four taps around a fraction ``t``."""
    dtype = t.dtype.type
    a = dtype(-0.75)
    one, two = dtype(1), dtype(2)
    s = t + one
    w0 = ((a * s - dtype(5) * a) * s + dtype(8) * a) * s - dtype(4) * a
    w1 = ((a + two) * t - (a + dtype(3))) * t * t + one
    u = one - t
    w2 = ((a + two) * u - (a + dtype(3))) * u * u + one
    v = two - t
    w3 = ((a * v - dtype(5) * a) * v + dtype(8) * a) * v - dtype(4) * a
    return [w0, w1, w2, w3]


def _grid_sample(op, mode: str) -> Kernel:
    padding = attribute(op, "padding_mode", "zeros")
    align_corners = bool(attribute(op, "align_corners", 0))
    if padding not in ("zeros", "border", "reflection"):
        raise unsupported(op, f"padding_mode {padding!r}")

    def kernel(inputs):
        x, grid = inputs[0], inputs[1]
        spatial = x.ndim - 2
        if spatial < 1 or grid.ndim != x.ndim or grid.shape[-1] != spatial or grid.shape[0] != x.shape[0]:
            raise unsupported(op, f"X {list(x.shape)} and grid {list(grid.shape)} (need [N, C, *in] and "
                                  f"[N, *out, {max(spatial, 1)}])")
        dtype = x.dtype.type
        sizes = x.shape[2:]
        grid = grid.astype(x.dtype, copy=False)
        # grid's last axis lists x (the innermost axis) first
        positions = [_denormalize(grid[..., spatial - 1 - axis], sizes[axis], align_corners) for axis in range(spatial)]
        if mode == "nearest":
            indices = [np.rint(p).astype(np.int64) for p in positions]
            return [_gather(x, *_pad_indices(indices, sizes, padding, align_corners, dtype))]
        floors = [np.floor(p) for p in positions]
        fractions = [(p - f).astype(x.dtype) for p, f in zip(positions, floors)]
        floors = [f.astype(np.int64) for f in floors]
        if mode == "linear":
            taps = [[(0, dtype(1) - t), (1, t)] for t in fractions]
        else:
            taps = [list(zip(range(-1, 3), _cubic_coefficients(t))) for t in fractions]
        y = np.zeros(x.shape[:2] + grid.shape[1:-1], x.dtype)
        for combination in itertools.product(*taps):
            indices = [f + step for f, (step, _) in zip(floors, combination)]
            weight = combination[0][1]
            for _, w in combination[1:]:
                weight = weight * w
            y += weight[:, None] * _gather(x, *_pad_indices(indices, sizes, padding, align_corners, dtype))
        return [y]
    return kernel


def _build_grid_sample_16(op, opset: int) -> Kernel:
    """GridSample 16-19: modes 'bilinear', 'nearest', 'bicubic' on 4-D inputs."""
    mode = attribute(op, "mode", "bilinear")
    names = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in names:
        raise unsupported(op, f"mode {mode!r} at opset {opset} (bilinear, nearest or bicubic)")
    return _grid_sample(op, names[mode])


def _build_grid_sample_20(op, opset: int) -> Kernel:
    """GridSample since 20: modes 'linear', 'nearest', 'cubic' on inputs of any rank."""
    mode = attribute(op, "mode", "linear")
    if mode not in ("linear", "nearest", "cubic"):
        raise unsupported(op, f"mode {mode!r} at opset {opset} (linear, nearest or cubic)")
    return _grid_sample(op, mode)


# ------------------------------------------------------------------- AffineGrid --
def _build_affine_grid(op, opset: int) -> Kernel:
    """AffineGrid: theta [N, 2, 3] (or [N, 3, 4]) applied to the normalised coordinates of an output of
    ``size`` [N, C, H, W] (or [N, C, D, H, W]) -> [N, H, W, 2] (or [N, D, H, W, 3]), x first."""
    align_corners = bool(attribute(op, "align_corners", 0))

    def kernel(inputs):
        theta, size = inputs[0], [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        spatial = len(size) - 2
        if spatial not in (2, 3) or theta.shape[1:] != (spatial, spatial + 1) or theta.shape[0] != size[0]:
            raise unsupported(op, f"theta {list(theta.shape)} for size {size}")
        dtype = theta.dtype.type
        axes = []
        for length in size[2:]:
            steps = np.arange(length, dtype=theta.dtype)
            if align_corners:   # -1 .. 1 (a single point: 1, as onnxruntime's Eigen LinSpaced)
                axes.append(np.linspace(-1, 1, length).astype(theta.dtype) if length > 1 else np.ones(1, theta.dtype))
            else:
                axes.append((dtype(2) * steps + dtype(1)) / dtype(length) - dtype(1))
        mesh = np.meshgrid(*axes, indexing="ij")                         # D, H, W order
        base = np.stack(list(mesh[::-1]) + [np.ones_like(mesh[0])], axis=-1)  # x, y, (z,) 1
        grid = np.einsum("...k,nik->n...i", base, theta)
        return [grid.astype(theta.dtype, copy=False)]
    return kernel


# ----------------------------------------------------------------------- Col2Im --
def _build_col2im(op, opset: int) -> Kernel:
    """Col2Im: blocks [N, C * prod(block), L] summed back into an image [N, C, *image_shape]."""
    def kernel(inputs):
        x = inputs[0]
        image = [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        block = [int(v) for v in np.asarray(inputs[2]).reshape(-1)]
        d = len(image)
        dilations = [int(v) for v in attribute(op, "dilations", [1] * d)]
        pads = [int(v) for v in attribute(op, "pads", [0] * 2 * d)]
        strides = [int(v) for v in attribute(op, "strides", [1] * d)]
        counts = [(image[i] + pads[i] + pads[i + d] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
                  for i in range(d)]
        per_block = int(np.prod(block))
        if x.ndim != 3 or x.shape[1] % per_block or x.shape[2] != int(np.prod(counts)):
            raise unsupported(op, f"input {list(x.shape)} for image {image}, block {block} ({counts} blocks)")
        n, channels = x.shape[0], x.shape[1] // per_block
        columns = x.reshape([n, channels] + block + counts)
        padded = np.zeros([n, channels] + [image[i] + pads[i] + pads[i + d] for i in range(d)], x.dtype)
        for offset in itertools.product(*[range(b) for b in block]):
            target = tuple(slice(o * dil, o * dil + (c - 1) * s + 1, s)
                           for o, dil, c, s in zip(offset, dilations, counts, strides))
            padded[(slice(None), slice(None)) + target] += columns[(slice(None), slice(None)) + offset]
        crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(d))
        return [padded[(slice(None), slice(None)) + crop]]
    return kernel


# ------------------------------------------------------------------- DeformConv --
def _build_deform_conv(op, opset: int) -> Kernel:
    """DeformConv: a convolution whose taps are shifted by per-position offsets (sampled multilinearly,
    zero outside the input) and scaled by an optional mask, then one GEMM per group."""
    group = int(attribute(op, "group", 1))
    offset_group = int(attribute(op, "offset_group", 1))

    def kernel(inputs):
        x, w, offset = inputs[0], inputs[1], inputs[2]
        bias, mask = _optional(inputs, 3), _optional(inputs, 4)
        d = x.ndim - 2
        kernel_shape = [int(k) for k in attribute(op, "kernel_shape", w.shape[2:])]
        dilations = [int(v) for v in attribute(op, "dilations", [1] * d)]
        pads = [int(v) for v in attribute(op, "pads", [0] * 2 * d)]
        strides = [int(v) for v in attribute(op, "strides", [1] * d)]
        n, channels, sizes = x.shape[0], x.shape[1], x.shape[2:]
        out = [(sizes[i] + pads[i] + pads[i + d] - dilations[i] * (kernel_shape[i] - 1) - 1) // strides[i] + 1
               for i in range(d)]
        taps = int(np.prod(kernel_shape))
        if channels % offset_group or channels % group or w.shape[1] * group != channels \
                or offset.shape != (n, offset_group * taps * d, *out):
            raise unsupported(op, f"X {list(x.shape)}, W {list(w.shape)}, offset {list(offset.shape)} with group "
                                  f"{group} and offset_group {offset_group}")
        dtype = x.dtype.type
        shifts = offset.astype(x.dtype).reshape(n, offset_group, taps, d, *out)
        tap_positions = np.array(list(itertools.product(*[range(k) for k in kernel_shape])))   # [taps, d]
        positions = []
        for axis in range(d):
            along = np.arange(out[axis]) * strides[axis] - pads[axis]
            base = along.reshape((1,) * 3 + tuple(-1 if a == axis else 1 for a in range(d)))
            tap = (tap_positions[:, axis] * dilations[axis]).reshape((1, 1, taps) + (1,) * d)
            positions.append((base + tap).astype(x.dtype) + shifts[:, :, :, axis])  # [N, G, taps, *out]
        inside = np.ones(positions[0].shape, bool)
        for p, size in zip(positions, sizes):
            inside &= (p > -1) & (p < size)
        floors = [np.floor(p) for p in positions]
        fractions = [(p - f).astype(x.dtype) for p, f in zip(positions, floors)]
        floors = [f.astype(np.int64) for f in floors]
        images = x.reshape(n * offset_group, channels // offset_group, *sizes)
        sampled = np.zeros((n * offset_group, channels // offset_group, taps) + tuple(out), x.dtype)
        for corner in itertools.product((0, 1), repeat=d):
            indices = [f + c for f, c in zip(floors, corner)]
            valid = inside.copy()
            weight = np.ones(inside.shape, x.dtype)
            for index, size, fraction, c in zip(indices, sizes, fractions, corner):
                valid &= (index >= 0) & (index < size)
                weight = weight * (fraction if c else dtype(1) - fraction)
            flat = [np.clip(index, 0, size - 1).reshape(n * offset_group, taps, *out)
                    for index, size in zip(indices, sizes)]
            values = _gather(images, flat, valid.reshape(n * offset_group, taps, *out))
            sampled += weight.reshape(n * offset_group, 1, taps, *out) * values
        sampled = sampled.reshape(n, offset_group, channels // offset_group, taps, *out)
        if mask is not None:
            sampled = sampled * mask.astype(x.dtype).reshape(n, offset_group, 1, taps, *out)
        columns = sampled.reshape(n, group, (channels // group) * taps, -1)
        weights = w.astype(x.dtype).reshape(group, w.shape[0] // group, -1)
        y = np.matmul(weights[None], columns).reshape(n, w.shape[0], *out)
        if bias is not None:
            y += bias.astype(x.dtype).reshape((1, -1) + (1,) * d)
        return [y]
    return kernel


KERNELS: dict = {
    "GridSample": by_opset({16: _build_grid_sample_16, 20: _build_grid_sample_20}),
    "AffineGrid": _build_affine_grid,
    "Col2Im": _build_col2im,
    "DeformConv": _build_deform_conv,
}
