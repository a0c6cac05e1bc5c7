"""The activation functions of the recurrent ops (LSTM, GRU, RNN) and how their alpha/beta are read.

Each function maps a float array to a new array of the same dtype.  Names are
matched without regard to case, as onnxruntime does.  The alpha/beta rules are
onnxruntime's (1.32), which deploys the models this executor simulates:
``activation_alpha`` / ``activation_beta`` are consumed in the order of the
activations that take them (the ONNX text), across directions; an activation
left without a value takes LeakyRelu 0.01, HardSigmoid 0.2 / 0.5, Elu 1.0, and
0 for the others (Affine, ThresholdedRelu, ScaledTanh: ONNX's own
ThresholdedRelu operator would default to 1.0, its deprecated Affine to 1.0).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

_QUIET = dict(all="ignore")


def _sigmoid(x, alpha, beta):
    with np.errstate(**_QUIET):
        out = np.negative(x)
        np.exp(out, out=out)
        out += 1
        return np.reciprocal(out, out=out)


def _tanh(x, alpha, beta):
    return np.tanh(x)


def _relu(x, alpha, beta):
    return np.maximum(x, x.dtype.type(0))


def _affine(x, alpha, beta):
    out = np.multiply(x, x.dtype.type(alpha))
    out += x.dtype.type(beta)
    return out


def _leaky_relu(x, alpha, beta):
    return np.where(x >= 0, x, x * x.dtype.type(alpha))


def _thresholded_relu(x, alpha, beta):
    return np.where(x > x.dtype.type(alpha), x, x.dtype.type(0))


def _scaled_tanh(x, alpha, beta):
    out = np.tanh(x * x.dtype.type(beta))
    out *= x.dtype.type(alpha)
    return out


def _hard_sigmoid(x, alpha, beta):
    out = _affine(x, alpha, beta)
    return np.clip(out, 0, 1, out=out)


def _elu(x, alpha, beta):
    with np.errstate(**_QUIET):
        return np.where(x >= 0, x, x.dtype.type(alpha) * np.expm1(x))


def _softsign(x, alpha, beta):
    return x / (1 + np.abs(x))


def _softplus(x, alpha, beta):
    with np.errstate(**_QUIET):   # log(1 + e^x) as written (onnxruntime's form: inf past x = 88 in float32)
        out = np.exp(x)
        out += 1
        return np.log(out, out=out)


#: lower-case name -> (function, takes alpha, takes beta)
ACTIVATIONS = {
    "sigmoid": (_sigmoid, False, False), "tanh": (_tanh, False, False), "relu": (_relu, False, False),
    "affine": (_affine, True, True), "leakyrelu": (_leaky_relu, True, False),
    "thresholdedrelu": (_thresholded_relu, True, False), "scaledtanh": (_scaled_tanh, True, True),
    "hardsigmoid": (_hard_sigmoid, True, True), "elu": (_elu, True, False),
    "softsign": (_softsign, False, False), "softplus": (_softplus, False, False)}

_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}

Activation = Callable[[np.ndarray], np.ndarray]


def activation_names() -> str:
    """The accepted names, for error messages."""
    return ", ".join(sorted(ACTIVATIONS))


def bind_activations(names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]) -> list[Activation] | str:
    """One function of x per name, alpha and beta bound (see the module docstring); a string saying what is
    wrong when a name is unknown."""
    keys = [str(name).lower() for name in names]
    unknown = [name for name, key in zip(names, keys) if key not in ACTIVATIONS]
    if unknown:
        return f"activation {unknown[0]!r} is not one of {activation_names()} (any case)"
    bound, alpha_at, beta_at = [], 0, 0
    for key in keys:
        function, takes_alpha, takes_beta = ACTIVATIONS[key]
        alpha, beta = _DEFAULTS.get(key, (0.0, 0.0))
        if takes_alpha and alpha_at < len(alphas):
            alpha, alpha_at = float(alphas[alpha_at]), alpha_at + 1
        if takes_beta and beta_at < len(betas):
            beta, beta_at = float(betas[beta_at]), beta_at + 1
        bound.append(lambda x, f=function, a=alpha, b=beta: f(x, a, b))
    return bound
