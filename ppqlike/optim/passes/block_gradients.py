"""Gradients of the ops a reconstructed block is made of (``block_reconstruction.py``), in numpy.

The forward values come from the executor's own kernels (the simulation the block is judged by); this module
gives each supported op's vector-Jacobian product: the gradients of a loss with respect to the op's inputs
from the gradient with respect to its output and the inputs it ran on.  Float32 throughout.

A convolution's gradients are taken one kernel position (i, j) at a time: with x_ij the padded input sampled
at rows i + s_h * h and columns j + s_w * w (the values that position multiplies) and groups g,

    dW[g, o, c, i, j] = sum_{n, h, w} dy[n, g, o, h, w] * x_ij[n, g, c, h, w]
    dx_ij[n, g, c, h, w] += sum_o W[g, o, c, i, j] * dy[n, g, o, h, w]

so no im2col matrix is held; a depthwise convolution (one input and one output channel per group) is the same
with elementwise products.  Gemm is y = x W^T + b (transB = 1) or x W + b.

Reads: the ops' attributes and the values passed.  Writes nothing.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Operation
from ...executor.ops._threads import computing_threads, parallel
from ...executor.ops.tensor import pad_widths
from .adaround_rows import conv_geometry

#: op types whose gradient this module gives (with the attribute limits of :func:`gradient_unsupported`)
GRADIENT_TYPES = frozenset({"Conv", "Gemm", "Relu", "Clip", "Add", "Concat", "GlobalAveragePool", "Flatten",
                            "Reshape", "Squeeze", "Unsqueeze", "Pad"})
#: the op types whose output at a position depends only on a neighbourhood of the input there (a block made of
#: these can be trained on crops of its input)
LOCAL_TYPES = frozenset({"Conv", "Relu", "Clip", "Add", "Concat", "Pad"})
RESHAPING_TYPES = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze"})


def gradient_unsupported(operation: Operation) -> str | None:
    """Why :func:`input_gradients` cannot take ``operation``, or None when it can."""
    kind, attributes = operation.type, operation.attributes
    if kind not in GRADIENT_TYPES:
        return f"no gradient for {kind}"
    if kind == "Conv":
        weight = operation.inputs[1].value if len(operation.inputs) > 1 and operation.inputs[1] is not None \
            else None
        geometry = None if weight is None else conv_geometry(operation, weight)
        if geometry is None:
            return "Conv is not 2-D with a constant weight and explicit pads"
        if any(d != 1 for d in geometry[2]):
            return "dilated Conv"
    if kind == "Gemm":
        if operation.inputs[1] is None or operation.inputs[1].value is None:
            return "Gemm without a constant weight"
        if float(attributes.get("alpha", 1.0)) != 1.0 or float(attributes.get("beta", 1.0)) != 1.0 or \
                int(attributes.get("transA", 0)):
            return "Gemm with alpha, beta or transA"
    if kind == "Pad":
        mode = attributes.get("mode", "constant")
        if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
            return "Pad that is not constant"
        if operation.inputs[1] is None or operation.inputs[1].value is None or \
                any(int(p) < 0 for p in np.asarray(operation.inputs[1].value).reshape(-1)):
            return "Pad with pads not constant or negative"
    return None


def conv_gradients(operation: Operation, x: np.ndarray, weight: np.ndarray, dy: np.ndarray):
    """(dx, dW) of a 2-D convolution (dilation 1) from its input, weight and output gradient.  Each image is a
    job of the kernel threads (its dx rows and its share of dW); the shares are summed in image order, so the
    result is the same whatever the number of threads."""
    (top, left, bottom, right), (sh, sw), _ = conv_geometry(operation, weight)
    groups = int(operation.attributes.get("group", 1))
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    og = o // groups
    _, _, ho, wo = dy.shape
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right))) if top or left or bottom or right else x
    dx_padded = np.zeros(padded.shape, np.float32)
    shares = np.zeros((n,) + weight.shape, np.float32)
    depthwise = cg == 1 and og == 1
    kernels = [[weight[:, :, i, j].reshape(groups, og, cg).transpose(0, 2, 1) for j in range(kw)] for i in range(kh)]
    taps = [[weight[:, 0, i, j][:, None, None] for j in range(kw)] for i in range(kh)]

    def image(k: int) -> None:
        gradient, x_image, dx_image, share = dy[k], padded[k], dx_padded[k], shares[k]
        gradient_grouped = gradient.reshape(groups, og, ho * wo)
        for i in range(kh):
            for j in range(kw):
                rows, cols = slice(i, i + sh * (ho - 1) + 1, sh), slice(j, j + sw * (wo - 1) + 1, sw)
                sampled = x_image[:, rows, cols]
                if depthwise:
                    share[:, 0, i, j] = np.einsum("chw,chw->c", gradient, sampled)
                    dx_image[:, rows, cols] += gradient * taps[i][j]
                    continue
                x_grouped = np.ascontiguousarray(sampled).reshape(groups, cg, ho * wo)
                # [g, og, P] @ [g, P, cg] -> [g, og, cg];  [g, cg, og] @ [g, og, P] -> [g, cg, P]
                share[:, :, i, j] = np.matmul(gradient_grouped, x_grouped.transpose(0, 2, 1)).reshape(o, cg)
                dx_image[:, rows, cols] += np.matmul(kernels[i][j], gradient_grouped).reshape(c, ho, wo)

    with computing_threads():
        parallel(image, range(n))
    dx = dx_padded[:, :, top:top + h, left:left + w]
    return dx, shares.sum(0)


def gemm_gradients(operation: Operation, x: np.ndarray, weight: np.ndarray, dy: np.ndarray):
    """(dx, dW) of Gemm y = x W^T + b (transB = 1) or x W + b."""
    if int(operation.attributes.get("transB", 0)):
        return dy @ weight, dy.T @ x
    return dy @ weight.T, x.T @ dy


def _unbroadcast(gradient: np.ndarray, shape: tuple) -> np.ndarray:
    """The gradient of a broadcast operand: summed over the axes broadcasting added or stretched."""
    while gradient.ndim > len(shape):
        gradient = gradient.sum(0)
    for axis, size in enumerate(shape):
        if size == 1 and gradient.shape[axis] != 1:
            gradient = gradient.sum(axis, keepdims=True)
    return gradient


def input_gradients(operation: Operation, inputs: list, dy: np.ndarray) -> list:
    """The gradient with respect to each of the op's inputs (None for those it does not reach) from the
    gradient ``dy`` of its (single) output and the ``inputs`` it ran on."""
    kind = operation.type
    x = inputs[0]
    result: list = [None] * len(inputs)
    if kind == "Conv":
        result[0], result[1] = conv_gradients(operation, x, inputs[1], dy)
    elif kind == "Gemm":
        result[0], result[1] = gemm_gradients(operation, x, inputs[1], dy)
    elif kind == "Relu":
        result[0] = dy * (x > 0)
    elif kind == "Clip":
        low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else operation.attributes.get("min", -np.inf)
        high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else operation.attributes.get("max", np.inf)
        result[0] = dy * ((x >= low) & (x <= high))
    elif kind == "Add":
        result[0], result[1] = _unbroadcast(dy, np.shape(inputs[0])), _unbroadcast(dy, np.shape(inputs[1]))
    elif kind == "Concat":
        axis = int(operation.attributes.get("axis", 1)) % dy.ndim
        bounds = np.cumsum([np.shape(value)[axis] for value in inputs])[:-1]
        result = list(np.split(dy, bounds, axis=axis))
    elif kind == "GlobalAveragePool":
        size = int(np.prod(x.shape[2:]))
        result[0] = np.broadcast_to(dy / np.float32(size), x.shape).astype(np.float32)
    elif kind == "Pad":
        widths = pad_widths(inputs, x.ndim)
        result[0] = dy[tuple(slice(begin, begin + size) for (begin, _), size in zip(widths, x.shape))]
    elif kind in RESHAPING_TYPES:
        result[0] = dy.reshape(np.shape(x))
    else:
        raise NotImplementedError(f"no gradient for {kind} ({operation.name})")
    return result
