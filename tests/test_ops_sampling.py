"""GridSample (opsets 16 and 20), AffineGrid, Col2Im and DeformConv against onnxruntime.

onnxruntime's GridSample runs 4-D and 5-D inputs (cubic on 4-D only): other ranks are compared with
onnx's ReferenceEvaluator.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

RTOL, ATOL = 1e-4, 1e-5


def _float(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


MODES = {16: ["bilinear", "nearest", "bicubic"], 20: ["linear", "nearest", "cubic"]}


@pytest.mark.parametrize("opset", [16, 20])
@pytest.mark.parametrize("mode_index", [0, 1, 2])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), size=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       out=st.tuples(st.integers(1, 5), st.integers(1, 5)), align=st.sampled_from([0, 1]),
       reach=st.sampled_from([1.0, 1.6, 3.5]), seed=st.integers(0, 2 ** 16))
def test_grid_sample_2d(opset, mode_index, padding, n, c, size, out, align, reach, seed):
    """Grid points up to ``reach`` (beyond [-1, 1]: padding) and exactly on pixel centres and borders."""
    x = _float((n, c) + size, seed)
    grid = _float((n,) + out + (2,), seed + 1, -reach, reach)
    grid.reshape(-1)[::3] = np.round(grid.reshape(-1)[::3] * 4) / 4
    attributes = {"mode": MODES[opset][mode_index], "padding_mode": padding, "align_corners": align}
    assert_matches_onnxruntime("GridSample", {"x": x, "grid": grid}, attributes, opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@settings(max_examples=5, deadline=None)
@given(size=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), align=st.sampled_from([0, 1]),
       seed=st.integers(0, 2 ** 16))
def test_grid_sample_3d(mode, padding, size, align, seed):
    x = _float((1, 2) + size, seed)
    grid = _float((1, 2, 3, 2, 3), seed + 1, -1.3, 1.3)
    attributes = {"mode": mode, "padding_mode": padding, "align_corners": align}
    assert_matches_onnxruntime("GridSample", {"x": x, "grid": grid}, attributes, opset=20, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_1d_against_the_reference(mode):
    x = _float((2, 3, 7), 4)
    grid = _float((2, 5, 1), 5, -1.2, 1.2)
    assert_matches_onnxruntime("GridSample", {"x": x, "grid": grid}, {"mode": mode}, opset=20, rtol=RTOL,
                               atol=ATOL, reference=True)


@pytest.mark.parametrize("spatial", [2, 3])
@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 2), sizes=st.lists(st.integers(1, 5), min_size=3, max_size=3), align=st.sampled_from([0, 1]),
       seed=st.integers(0, 2 ** 16))
def test_affine_grid(spatial, n, sizes, align, seed):
    theta = _float((n, spatial, spatial + 1), seed, -2, 2)
    size = np.array([n, 3] + sizes[:spatial], np.int64)
    assert_matches_onnxruntime("AffineGrid", {"theta": theta, "size": size}, {"align_corners": align}, opset=20,
                               initializers={"size"}, rtol=RTOL, atol=ATOL)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 3), n=st.integers(1, 2), c=st.integers(1, 3), data=st.data())
def test_col2im(d, n, c, data):
    image = data.draw(st.lists(st.integers(2, 7), min_size=d, max_size=d))
    block = [data.draw(st.integers(1, s)) for s in image]
    dilations = [data.draw(st.integers(1, 2)) for _ in range(d)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(d)]
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * d, max_size=2 * d))
    counts = [(image[i] + pads[i] + pads[i + d] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(d)]
    if min(counts) < 1:
        return
    x = _float((n, c * int(np.prod(block)), int(np.prod(counts))), sum(image))
    attributes = {"dilations": dilations, "strides": strides, "pads": pads}
    inputs = {"x": x, "image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    # onnxruntime runs Col2Im on 2-D images only
    assert_matches_onnxruntime("Col2Im", inputs, attributes, opset=18, initializers={"image", "block"},
                               rtol=RTOL, atol=ATOL, reference=d != 2)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), groups=st.integers(1, 2), offset_groups=st.integers(1, 2), per_group=st.integers(1, 2),
       m=st.integers(1, 2), size=st.tuples(st.integers(2, 6), st.integers(2, 6)),
       kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)), stride=st.integers(1, 2), pad=st.integers(0, 1),
       dilation=st.integers(1, 2), with_bias=st.booleans(), with_mask=st.booleans(),
       reach=st.sampled_from([0.0, 1.5, 4.0]),
       seed=st.integers(0, 2 ** 16))
def test_deform_conv(n, groups, offset_groups, per_group, m, size, kernel, stride, pad, dilation, with_bias,
                     with_mask, reach, seed):
    channels = groups * offset_groups * per_group
    out = [(s + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for s, k in zip(size, kernel)]
    if min(out) < 1:
        return
    taps = kernel[0] * kernel[1]
    inputs = {"x": _float((n, channels) + size, seed), "w": _float((m * groups, channels // groups) + kernel, seed + 1),
              "offset": _float([n, offset_groups * taps * 2] + out, seed + 2, -reach, reach)}
    inputs["offset"].reshape(-1)[::4] = np.round(inputs["offset"].reshape(-1)[::4])   # whole-pixel shifts too
    if with_bias or with_mask:
        inputs["b"] = _float([m * groups], seed + 3) if with_bias else None
    if with_mask:
        inputs["mask"] = _float([n, offset_groups * taps] + out, seed + 4, 0, 1)
    attributes = {"group": groups, "offset_group": offset_groups, "strides": [stride] * 2, "pads": [pad] * 4,
                  "dilations": [dilation] * 2, "kernel_shape": list(kernel)}
    assert_matches_onnxruntime("DeformConv", inputs, attributes, opset=22 if seed % 2 else 19, rtol=RTOL, atol=ATOL)
