"""Kernels of the signal family: DFT (opsets 17 and 20), STFT, the Hann, Hamming and Blackman windows
and MelWeightMatrix.

Signals carry their real and imaginary parts in a last axis of size 1 (real) or 2 (complex).
Transforms run in float64 (numpy's FFT) and are rounded once to the input dtype.  The windows and
the mel filter bank follow onnxruntime's arithmetic: pi truncated to 3.14159265, coefficients in
float32, values computed in double and converted (truncated for integer output types).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .base import Kernel, attribute, by_opset, normalize_axis, unsupported

_PI = 3.14159265          # onnxruntime's constant (its windows and DFT twiddles use it)


def _scalar_int(array) -> int:
    return int(np.asarray(array).reshape(-1)[0])


def _optional(inputs, index):
    return inputs[index] if index < len(inputs) else None


def _as_complex(op, x: np.ndarray) -> np.ndarray:
    """A [..., 1] (real) or [..., 2] (complex) signal as a complex128 array without the last axis."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise unsupported(op, f"a signal of shape {list(x.shape)} (the last axis must be 1 (real) or 2 (complex))")
    z = x[..., 0].astype(np.complex128)
    if x.shape[-1] == 2:
        z.imag = x[..., 1]
    return z


def _as_pairs(z: np.ndarray, dtype) -> np.ndarray:
    """A complex array as [..., 2] (real, imaginary) of ``dtype``."""
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _dft(op, x: np.ndarray, axis: int, length: int | None, inverse: bool, onesided: bool) -> np.ndarray:
    if not -x.ndim <= axis < x.ndim - 1 or normalize_axis(axis, x.ndim) == x.ndim - 1:
        raise unsupported(op, f"axis {axis} for a signal of rank {x.ndim} (the last axis holds the parts)")
    axis = normalize_axis(axis, x.ndim)
    z = _as_complex(op, x)
    if length is not None and length < 1:
        raise unsupported(op, f"dft_length {length} (must be positive)")
    if inverse and onesided:   # IRFFT: a one-sided spectrum in, a real signal of dft_length out
        n = 2 * (z.shape[axis] - 1) if length is None else length
        if n < 1:
            raise unsupported(op, f"an inverse one-sided DFT of a {z.shape[axis]}-bin spectrum without dft_length")
        return np.fft.irfft(z, n=n, axis=axis)[..., None].astype(x.dtype)
    n = z.shape[axis] if length is None else length
    y = np.fft.ifft(z, n=n, axis=axis) if inverse else np.fft.fft(z, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return _as_pairs(y, x.dtype)


def _build_dft_17(op, opset: int) -> Kernel:
    """DFT before opset 20: the axis is an attribute (default 1, the first after the batch axis)."""
    axis = int(attribute(op, "axis", 1))
    inverse, onesided = bool(attribute(op, "inverse", 0)), bool(attribute(op, "onesided", 0))

    def kernel(inputs):
        length = _optional(inputs, 1)
        return [_dft(op, inputs[0], axis, None if length is None else _scalar_int(length), inverse, onesided)]
    return kernel


def _build_dft_20(op, opset: int) -> Kernel:
    """DFT since opset 20: the axis is an optional input (default -2, the last signal axis)."""
    inverse, onesided = bool(attribute(op, "inverse", 0)), bool(attribute(op, "onesided", 0))

    def kernel(inputs):
        length, axis = _optional(inputs, 1), _optional(inputs, 2)
        axis = -2 if axis is None else _scalar_int(axis)
        return [_dft(op, inputs[0], axis, None if length is None else _scalar_int(length), inverse, onesided)]
    return kernel


def _build_stft(op, opset: int) -> Kernel:
    """STFT: frames of ``frame_length`` every ``frame_step`` samples, times the window, each transformed:
    [batch, frames, bins, 2] with bins = frame_length // 2 + 1 when onesided."""
    onesided = bool(attribute(op, "onesided", 1))

    def kernel(inputs):
        x, step = inputs[0], _scalar_int(inputs[1])
        window, length = _optional(inputs, 2), _optional(inputs, 3)
        if x.ndim != 3:
            raise unsupported(op, f"a signal of shape {list(x.shape)} (need [batch, length, 1 or 2])")
        z = _as_complex(op, x)
        size = z.shape[1] if length is None and window is None else \
            (window.shape[0] if length is None else _scalar_int(length))
        if window is not None and window.shape[0] != size:
            raise unsupported(op, f"a window of {window.shape[0]} samples for frames of {size}")
        if step < 1 or not 0 < size <= z.shape[1]:
            raise unsupported(op, f"frame_step {step} and frame_length {size} for a signal of {z.shape[1]}")
        count = (z.shape[1] - size) // step + 1
        starts = np.arange(count) * step
        frames = z[:, starts[:, None] + np.arange(size)]             # [batch, frames, frame_length]
        if window is not None:
            frames = frames * window.astype(np.float64)
        y = np.fft.fft(frames, axis=-1)
        if onesided:
            y = y[..., :size // 2 + 1]
        return [_as_pairs(y, x.dtype)]
    return kernel


def _output_dtype(op) -> np.dtype:
    code = int(attribute(op, "output_datatype", 1))
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(code))
    except Exception:
        raise unsupported(op, f"output_datatype {code}") from None
    if dtype.kind not in "iuf":
        raise unsupported(op, f"output_datatype {code} ({dtype}; numbers only)")
    return dtype


def _cosine_sum_window(a0: float, a1: float, a2: float):
    """Builder of a window a0 - a1 cos(w n) + a2 cos(2 w n), w = 2 pi / N (N = size, or size - 1 when
    not periodic); the coefficients are float32 values, as in onnxruntime."""
    a0, a1, a2 = (float(np.float32(a)) for a in (a0, a1, a2))

    def build(op, opset: int) -> Kernel:
        periodic = bool(attribute(op, "periodic", 1))
        dtype = _output_dtype(op)

        def kernel(inputs):
            size = _scalar_int(inputs[0])
            if size < 0:
                raise unsupported(op, f"size {size}")
            with np.errstate(all="ignore"):
                increment = 2 * _PI / (size if periodic else size - 1)
                n = np.arange(size, dtype=np.float64)
                w = a0 - a1 * np.cos(increment * n)
                if a2:
                    w += a2 * np.cos(2 * increment * n)
                return [w.astype(dtype)]
        return kernel
    return build


def _mel_bins(num_mel_bins: int, dft_length: int, sample_rate: int, low: float, high: float) -> np.ndarray:
    """The spectrogram bin of each of the num_mel_bins + 2 filter edges, evenly spaced in mel."""
    low_mel, high_mel = (2595 * np.log10(1 + np.float64(f) / 700) for f in (low, high))
    step = (high_mel - low_mel) / (num_mel_bins + 2)
    hertz = 700 * (np.power(10.0, (low_mel + step * np.arange(num_mel_bins + 2)) / 2595) - 1)
    return np.floor((dft_length + 1) * hertz / sample_rate).astype(np.int64)


def _build_mel_weight_matrix(op, opset: int) -> Kernel:
    """MelWeightMatrix: [dft_length // 2 + 1, num_mel_bins] triangular filters of peak 1."""
    dtype = _output_dtype(op)

    def kernel(inputs):
        num_mel_bins, dft_length, sample_rate = (_scalar_int(a) for a in inputs[:3])
        low, high = (np.float32(np.asarray(a).reshape(-1)[0]) for a in inputs[3:5])
        bins = dft_length // 2 + 1
        for edge in (low, high):
            if not 0 <= np.floor((dft_length + 1) * np.float64(edge) / sample_rate) < bins:
                raise unsupported(op, f"edge {edge} Hz is outside the {bins} bins of a {dft_length}-point DFT at "
                                      f"{sample_rate} Hz")
        edges = _mel_bins(num_mel_bins, dft_length, sample_rate, low, high)
        left, center, right = edges[:-2], edges[1:-1], edges[2:]
        j = np.arange(bins)[:, None]
        compute = dtype if dtype.kind == "f" else np.float64
        with np.errstate(all="ignore"):
            rising = (j - left).astype(compute) / (center - left).astype(compute)
            falling = (right - j).astype(compute) / (right - center).astype(compute)
        if dtype.kind != "f":   # onnxruntime divides integers there
            rising, falling = np.trunc(rising), np.trunc(falling)
        weights = np.zeros((bins, num_mel_bins), np.float64)
        weights = np.where((j >= left) & (j < center), rising, weights)
        weights = np.where((j > center) & (j < right), falling, weights)
        weights = np.where(j == center, 1.0, weights)
        return [weights.astype(dtype)]
    return kernel


KERNELS: dict = {
    "DFT": by_opset({17: _build_dft_17, 20: _build_dft_20}),
    "STFT": _build_stft,
    "HannWindow": _cosine_sum_window(0.5, 0.5, 0.0),
    "HammingWindow": _cosine_sum_window(25 / 46, 1 - np.float32(25 / 46), 0.0),
    "BlackmanWindow": _cosine_sum_window(0.5 - np.float32(0.16) / np.float32(2), 0.5, np.float32(0.16) / np.float32(2)),
    "MelWeightMatrix": _build_mel_weight_matrix,
}
