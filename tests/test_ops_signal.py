"""DFT (opsets 17 and 20), STFT, the window functions and MelWeightMatrix against onnxruntime.

onnxruntime transforms lengths that are not powers of two with a naive float32 DFT whose phases
(k * n * 2 pi / N with pi = 3.14159265, in float32) drift as k * n grows: measured against a float64
FFT, its largest error is 5e-4 on outputs of magnitude ~10 at N = 100 and 4e-3 of 47 at N = 400.
The executor computes the exact transform (float64), so at such lengths it is compared with onnx's
ReferenceEvaluator; at powers of two (onnxruntime's radix-2 FFT) and short lengths with onnxruntime.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

RTOL = 1e-4


def _signal(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tolerance(x, length):
    """Absolute tolerance: 1e-4 of the largest possible output (sum of magnitudes), for near-zero bins."""
    return 1e-4 * max(float(np.abs(x).max()) * max(length, 1), 1.0)


def _exact_at_onnxruntime(length):
    return length <= 32 or length & (length - 1) == 0


@pytest.mark.parametrize("opset", [17, 20])
@settings(max_examples=25, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=2), length=st.sampled_from([1, 2, 5, 8, 12, 16, 33, 64]),
       complex_input=st.booleans(), inverse=st.booleans(), onesided=st.booleans(), data=st.data())
def test_dft(opset, batch, length, complex_input, inverse, onesided, data):
    if onesided and (complex_input != inverse):
        complex_input = inverse   # RFFT takes real input, IRFFT complex (onnxruntime's shape inference)
    if onesided and inverse and opset == 17:
        onesided = False          # IRFFT is opset 20's
    if onesided and inverse and length == 1:
        length = 2                # the default IRFFT length 2 * (bins - 1) needs two bins
    shape = batch + [length, 2 if complex_input else 1]
    axis = len(batch)                                  # the signal axis
    inputs = {"x": _signal(shape, length)}
    dft_length = data.draw(st.one_of(st.none(), st.integers(1, 40)))
    if dft_length is not None:
        inputs["dft_length"] = np.array(dft_length, np.int64)
    attributes = {"inverse": int(inverse), "onesided": int(onesided)}
    if opset == 17:
        attributes["axis"] = axis
    elif data.draw(st.booleans()):
        if "dft_length" not in inputs:
            inputs["dft_length"] = None
        inputs["axis"] = np.array(axis - len(shape), np.int64)
    n = dft_length or length
    # onnxruntime's IRFFT of a spectrum of other than dft_length // 2 + 1 bins is neither the spec's
    # truncation/zero-padding nor consistent; there the ReferenceEvaluator decides (numpy's irfft)
    odd_spectrum = onesided and inverse and dft_length is not None and length != dft_length // 2 + 1
    assert_matches_onnxruntime("DFT", inputs, attributes, opset=opset, initializers={"dft_length", "axis"},
                               rtol=RTOL, atol=_tolerance(inputs["x"], n),
                               reference=odd_spectrum or not _exact_at_onnxruntime(n))


@pytest.mark.parametrize("length", [100, 400])
def test_dft_long_lengths_against_the_reference(length):
    x = _signal([2, length, 1], 5)
    assert_matches_onnxruntime("DFT", {"x": x}, {"onesided": 1}, opset=20, rtol=RTOL, atol=_tolerance(x, length),
                               reference=True)


def test_dft_double():
    x = _signal([2, 16, 2], 7, np.float64)
    assert_matches_onnxruntime("DFT", {"x": x}, opset=20, rtol=1e-9, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 2), frame=st.sampled_from([4, 8, 16, 10]), step=st.integers(1, 6), extra=st.integers(1, 20),
       window=st.sampled_from(["none", "hann", "ones"]), onesided=st.booleans(), complex_input=st.booleans(),
       pass_length=st.booleans())
def test_stft(batch, frame, step, extra, window, onesided, complex_input, pass_length):
    if onesided:
        complex_input = False
    x = _signal([batch, frame + extra, 2 if complex_input else 1], frame)
    inputs = {"x": x, "step": np.array(step, np.int64)}
    if window != "none":
        w = np.hanning(frame + 1)[:frame] if window == "hann" else np.ones(frame)
        inputs["window"] = w.astype(np.float32)
    if pass_length or window == "none":
        inputs.setdefault("window", None)
        inputs["frame_length"] = np.array(frame, np.int64)
    assert_matches_onnxruntime("STFT", inputs, {"onesided": int(onesided)}, opset=17,
                               initializers={"step", "window", "frame_length"}, rtol=RTOL,
                               atol=_tolerance(x, frame), reference=not _exact_at_onnxruntime(frame))


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [1, 11, 7])   # float, double, int64 (truncated)
@pytest.mark.parametrize("size", [2, 5, 64, 401])
def test_windows(op, periodic, dtype, size):
    assert_matches_onnxruntime(op, {"size": np.array(size, np.int64)}, {"periodic": periodic, "output_datatype": dtype},
                               opset=17, initializers={"size"}, rtol=RTOL, atol=1e-7)


@settings(max_examples=20, deadline=None)
@given(bins=st.integers(1, 40), dft_length=st.sampled_from([64, 256, 400, 512, 1024]),
       rate=st.sampled_from([8000, 16000, 22050, 44100]), low=st.floats(0, 300), fraction=st.floats(0.3, 0.99),
       dtype=st.sampled_from([1, 11, 6]))
def test_mel_weight_matrix(bins, dft_length, rate, low, fraction, dtype):
    high = low + (rate / 2 - low) * fraction
    inputs = {"num_mel_bins": np.array(bins, np.int64), "dft_length": np.array(dft_length, np.int64),
              "sample_rate": np.array(rate, np.int64), "low": np.array(low, np.float32),
              "high": np.array(high, np.float32)}
    assert_matches_onnxruntime("MelWeightMatrix", inputs, {"output_datatype": dtype}, opset=17,
                               initializers=set(inputs), rtol=RTOL, atol=1e-7)
