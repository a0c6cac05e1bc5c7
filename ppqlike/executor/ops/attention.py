"""Kernels of the attention family (opset 23): Attention and RotaryEmbedding.

Attention covers multi-head, grouped-query and multi-query attention on 4-D ([batch, heads, sequence,
head_size]) or 3-D ([batch, sequence, heads * head_size]) inputs, with a key/value cache, a boolean or
additive mask, causal masking aligned to the bottom right (query i sees keys up to i + past length),
softcap and the four qk_matmul_output modes.  A query row with every key masked gives zeros.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .base import Kernel, attribute, unsupported


def _optional(inputs, index):
    return inputs[index] if index < len(inputs) else None


def _heads_first(op, x: np.ndarray, heads: int | None, name: str) -> np.ndarray:
    """[B, S, H * D] -> [B, H, S, D] (``heads`` from the attribute); 4-D inputs as they are."""
    if x.ndim == 4:
        return x
    if x.ndim != 3 or not heads or x.shape[2] % heads:
        raise unsupported(op, f"{name} of shape {list(x.shape)} (4-D, or 3-D with its num_heads attribute)")
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; rows that are -inf everywhere give zeros."""
    top = np.max(scores, axis=-1, keepdims=True)
    masked = ~np.isfinite(top)
    with np.errstate(all="ignore"):
        e = np.exp(scores - np.where(masked, 0, top))
        total = np.sum(e, axis=-1, keepdims=True)
        probabilities = e / total
    return np.where(masked | (total == 0), 0, probabilities).astype(scores.dtype, copy=False)


def _build_attention(op, opset: int) -> Kernel:
    causal = bool(attribute(op, "is_causal", 0))
    q_heads, kv_heads = attribute(op, "q_num_heads", None), attribute(op, "kv_num_heads", None)
    mode = int(attribute(op, "qk_matmul_output_mode", 0))
    scale_attr = attribute(op, "scale", None)
    softcap = float(attribute(op, "softcap", 0.0))
    precision = attribute(op, "softmax_precision", None)
    if mode not in (0, 1, 2, 3):
        raise unsupported(op, f"qk_matmul_output_mode {mode} (0 to 3)")
    n_outputs = len(op.outputs)

    def kernel(inputs):
        q, k, v = inputs[0], inputs[1], inputs[2]
        mask, past_key, past_value = (_optional(inputs, i) for i in (3, 4, 5))
        three_d = q.ndim == 3
        q4 = _heads_first(op, q, q_heads, "Q")
        k4 = _heads_first(op, k, kv_heads, "K")
        v4 = _heads_first(op, v, kv_heads, "V")
        if (past_key is None) != (past_value is None):
            raise unsupported(op, "past_key without past_value (or the reverse)")
        past = 0 if past_key is None else past_key.shape[2]
        if past_key is not None:
            k4 = np.concatenate([past_key, k4], axis=2)
            v4 = np.concatenate([past_value, v4], axis=2)
        present_key, present_value = k4, v4
        heads, kv = q4.shape[1], k4.shape[1]
        if heads % kv:
            raise unsupported(op, f"{heads} query heads for {kv} key/value heads (must divide)")
        if heads != kv:
            k4, v4 = np.repeat(k4, heads // kv, axis=1), np.repeat(v4, heads // kv, axis=1)
        dtype = q.dtype
        compute = dtype if precision is None else np.dtype(helper.tensor_dtype_to_np_dtype(int(precision)))
        scale = 1.0 / np.sqrt(q4.shape[3]) if scale_attr is None else float(scale_attr)
        scores = np.matmul(q4, np.swapaxes(k4, -1, -2)) * dtype.type(scale)
        qk_outputs = [scores]
        if softcap > 0:
            scores = dtype.type(softcap) * np.tanh(scores / dtype.type(softcap))
        qk_outputs.append(scores)
        length, total = q4.shape[2], k4.shape[2]
        bias = np.zeros((1, 1, length, total), dtype)
        if causal:
            allowed = np.arange(total)[None, :] <= np.arange(length)[:, None] + past
            bias = np.where(allowed, bias, dtype.type(-np.inf))
        if mask is not None:
            bias = np.where(mask, bias, dtype.type(-np.inf)) if mask.dtype == bool else bias + mask.astype(dtype)
        scores = scores + bias
        qk_outputs.append(scores)
        probabilities = _softmax(scores.astype(compute)).astype(dtype)
        qk_outputs.append(probabilities)
        y = np.matmul(probabilities, v4)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
        outputs = [y, present_key, present_value, qk_outputs[mode]]
        return outputs[:max(n_outputs, 1)]
    return kernel


def _build_rotary_embedding(op, opset: int) -> Kernel:
    """RotaryEmbedding: pairs of features (the two halves, or even/odd ones when interleaved) of the first
    rotary_embedding_dim features rotated by the cached cos/sin of each token's position."""
    interleaved = bool(attribute(op, "interleaved", 0))
    heads = attribute(op, "num_heads", None)
    rotary_dim = int(attribute(op, "rotary_embedding_dim", 0))

    def kernel(inputs):
        x, cos, sin, positions = inputs[0], inputs[1], inputs[2], _optional(inputs, 3)
        x4 = _heads_first(op, x, heads, "X").transpose(0, 2, 1, 3)        # [B, S, H, D]
        dim = rotary_dim or x4.shape[3]
        if positions is not None:
            cos, sin = cos[positions.astype(np.int64)], sin[positions.astype(np.int64)]
        if dim % 2 or dim > x4.shape[3] or cos.shape[-1] != dim // 2 or sin.shape[-1] != dim // 2:
            raise unsupported(op, f"rotary dimension {dim} with caches of {cos.shape[-1]} values for heads of "
                                  f"{x4.shape[3]}")
        cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
        rotate = x4[..., :dim]
        first, second = (rotate[..., 0::2], rotate[..., 1::2]) if interleaved else np.split(rotate, 2, axis=-1)
        real = cos * first - sin * second
        imaginary = sin * first + cos * second
        if interleaved:
            rotated = np.stack([real, imaginary], axis=-1).reshape(rotate.shape)
        else:
            rotated = np.concatenate([real, imaginary], axis=-1)
        y = np.concatenate([rotated, x4[..., dim:]], axis=-1)
        if x.ndim == 3:
            return [y.reshape(x.shape)]
        return [y.transpose(0, 2, 1, 3)]
    return kernel


KERNELS: dict = {
    "Attention": _build_attention,
    "RotaryEmbedding": _build_rotary_embedding,
}
