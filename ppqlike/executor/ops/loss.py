"""Kernels of the loss family: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Training graphs end in them, but they are deterministic functions of their inputs, so the executor
runs them like any op (a model evaluated with its loss, or exported from a training framework).
Targets equal to ``ignore_index`` count neither in the loss nor in the mean's weights.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, unsupported


def _optional(inputs, index):
    return inputs[index] if index < len(inputs) else None


def _negative_log_likelihood(op, log_probabilities: np.ndarray, target: np.ndarray, weight, reduction: str,
                             ignore_index) -> np.ndarray:
    """-log_probabilities[n, target[n, ...], ...] weighted, then reduced ('none', 'sum' or weighted 'mean')."""
    if log_probabilities.ndim < 2 or target.shape != log_probabilities.shape[:1] + log_probabilities.shape[2:]:
        raise unsupported(op, f"input {list(log_probabilities.shape)} and target {list(target.shape)} (need "
                              "[N, C, ...] and [N, ...])")
    target = target.astype(np.int64)
    ignored = np.zeros(target.shape, bool) if ignore_index is None else target == ignore_index
    classes = np.where(ignored, 0, target)
    if (classes < 0).any() or (classes >= log_probabilities.shape[1]).any():
        raise unsupported(op, f"a target outside [0, {log_probabilities.shape[1]})")
    picked = np.take_along_axis(log_probabilities, classes[:, None], axis=1)[:, 0]
    weights = np.ones(target.shape, log_probabilities.dtype) if weight is None else \
        weight.astype(log_probabilities.dtype)[classes]
    weights = np.where(ignored, 0, weights).astype(log_probabilities.dtype)
    loss = -picked * weights
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(loss.sum(dtype=np.float64), dtype=log_probabilities.dtype)
    with np.errstate(all="ignore"):
        return np.asarray(loss.sum(dtype=np.float64) / weights.sum(dtype=np.float64), dtype=log_probabilities.dtype)


def _reduction(op) -> str:
    reduction = attribute(op, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise unsupported(op, f"reduction {reduction!r} ('none', 'sum' or 'mean')")
    return reduction


def _build_negative_log_likelihood_loss(op, opset: int) -> Kernel:
    reduction, ignore_index = _reduction(op), attribute(op, "ignore_index", None)

    def kernel(inputs):
        return [_negative_log_likelihood(op, inputs[0], inputs[1], _optional(inputs, 2), reduction, ignore_index)]
    return kernel


def _build_softmax_cross_entropy_loss(op, opset: int) -> Kernel:
    """SoftmaxCrossEntropyLoss: the negative log-likelihood of log_softmax(scores) over axis 1; the second
    output is that log_softmax."""
    reduction, ignore_index = _reduction(op), attribute(op, "ignore_index", None)

    def kernel(inputs):
        scores = inputs[0]
        compute = np.float64 if scores.dtype == np.float64 else np.float32
        shifted = scores.astype(compute) - scores.max(axis=1, keepdims=True).astype(compute)
        log_probabilities = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
        log_probabilities = log_probabilities.astype(scores.dtype)
        loss = _negative_log_likelihood(op, log_probabilities, inputs[1], _optional(inputs, 2), reduction,
                                        ignore_index)
        return [loss, log_probabilities]
    return kernel


KERNELS: dict = {
    "NegativeLogLikelihoodLoss": _build_negative_log_likelihood_loss,
    "SoftmaxCrossEntropyLoss": _build_softmax_cross_entropy_loss,
}
