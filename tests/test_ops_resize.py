"""Resize against onnxruntime: every mode x coordinate mode x up/down-sampling."""

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime as check
from ppqlike.core.errors import UnsupportedOperationError
from ppqlike.core.ir import Operation
from ppqlike.executor.ops import build_kernel

RNG = np.random.default_rng(2)
X = RNG.standard_normal((2, 3, 7, 9)).astype(np.float32)
EMPTY = np.array([], np.float32)
TOL = dict(rtol=1e-5, atol=1e-5)

MODES = [("nearest", "round_prefer_floor"), ("nearest", "round_prefer_ceil"), ("nearest", "floor"),
         ("nearest", "ceil"), ("linear", None), ("cubic", None)]
COORDINATES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn"]
SCALES = [(2.0, 2.0), (1.7, 2.5), (0.5, 0.5), (0.6, 0.35), (3.0, 0.45)]


def attributes(mode, nearest_mode, coordinate_mode, **extra):
    result = {"mode": mode, "coordinate_transformation_mode": coordinate_mode, **extra}
    if nearest_mode is not None:
        result["nearest_mode"] = nearest_mode
    return result


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("coordinate_mode", COORDINATES)
@pytest.mark.parametrize("mode,nearest_mode", MODES)
def test_resize_scales(mode, nearest_mode, coordinate_mode, scales):
    inputs = {"x": X, "roi": EMPTY, "scales": np.array([1, 1, *scales], np.float32)}
    check("Resize", inputs, attributes(mode, nearest_mode, coordinate_mode), initializers={"roi", "scales"},
          opset=13, **TOL)


@pytest.mark.parametrize("sizes", [(14, 18), (5, 4), (1, 1), (11, 3), (7, 13)])
@pytest.mark.parametrize("coordinate_mode", COORDINATES)
@pytest.mark.parametrize("mode,nearest_mode", MODES)
def test_resize_sizes_opset11(mode, nearest_mode, coordinate_mode, sizes):
    inputs = {"x": X, "roi": EMPTY, "scales": EMPTY, "sizes": np.array([2, 3, *sizes], np.int64)}
    check("Resize", inputs, attributes(mode, nearest_mode, coordinate_mode), initializers={"roi", "scales", "sizes"},
          opset=11, **TOL)


@pytest.mark.parametrize("opset", [13, 18])
def test_resize_omitted_optional_inputs(opset):
    inputs = {"x": X, "roi": None, "scales": None, "sizes": np.array([2, 3, 10, 5], np.int64)}
    check("Resize", inputs, {"mode": "linear"}, initializers={"sizes"}, opset=opset, **TOL)
    inputs = {"x": X, "roi": None, "scales": np.array([1, 1, 0.5, 1.5], np.float32)}
    check("Resize", inputs, {"mode": "nearest"}, initializers={"scales"}, opset=opset, exact=True)


def test_resize_dynamic_scales_and_sizes():
    inputs = {"x": X, "roi": EMPTY, "scales": np.array([1, 1, 1.5, 0.75], np.float32)}
    check("Resize", inputs, {"mode": "linear"}, initializers={"roi"}, opset=13, **TOL)
    inputs = {"x": X, "roi": None, "scales": None, "sizes": np.array([2, 3, 4, 17], np.int64)}
    check("Resize", inputs, {"mode": "nearest"}, opset=13, exact=True)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_3d_and_2d_inputs(mode):
    volume = RNG.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
    inputs = {"x": volume, "roi": EMPTY, "scales": np.array([1, 1, 2, 0.5, 1.5], np.float32)}
    check("Resize", inputs, {"mode": mode}, initializers={"roi", "scales"}, opset=13, **TOL)
    plane = RNG.standard_normal((5, 6)).astype(np.float32)
    inputs = {"x": plane, "roi": EMPTY, "scales": np.array([1.6, 0.5], np.float32)}
    check("Resize", inputs, {"mode": mode}, initializers={"roi", "scales"}, opset=13, **TOL)


@pytest.mark.parametrize("mode,nearest_mode", [("nearest", "round_prefer_floor"), ("linear", None),
                                               ("cubic", None)])
@pytest.mark.parametrize("sizes", [(12, 5), (1, 4)])
def test_resize_tf_crop_and_resize(mode, nearest_mode, sizes):
    roi = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32)
    inputs = {"x": X, "roi": roi, "scales": EMPTY, "sizes": np.array([2, 3, *sizes], np.int64)}
    attrs = attributes(mode, nearest_mode, "tf_crop_and_resize", extrapolation_value=-7.0)
    check("Resize", inputs, attrs, initializers={"roi", "scales", "sizes"}, opset=11, **TOL)


@pytest.mark.parametrize("a,exclude", [(-0.5, 0), (-0.75, 1)])
@pytest.mark.parametrize("scales", [(2.0, 1.5), (0.5, 0.7)])
def test_resize_cubic_options(a, exclude, scales):
    inputs = {"x": X, "roi": EMPTY, "scales": np.array([1, 1, *scales], np.float32)}
    check("Resize", inputs, {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude},
          initializers={"roi", "scales"}, opset=13, **TOL)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_half_pixel_symmetric_opset19(mode):
    inputs = {"x": X, "roi": None, "scales": None, "sizes": np.array([2, 3, 10, 4], np.int64)}
    check("Resize", inputs, {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"},
          initializers={"sizes"}, opset=19, **TOL)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode,axes,sizes", [("nearest", None, (2, 3, 5, 20)), ("linear", [2, 3], (5, 20)),
                                             ("linear", [3, 2], (20, 5))])
def test_resize_axes_and_aspect_ratio_opset18(policy, mode, axes, sizes):
    attrs = {"mode": mode, "keep_aspect_ratio_policy": policy}
    if axes is not None:
        attrs["axes"] = axes
    inputs = {"x": X, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)}
    check("Resize", inputs, attrs, initializers={"sizes"}, opset=18, **TOL)


def test_resize_negative_axes_opset18():
    # (onnxruntime ignores sizes given with negative axes under a keep_aspect_ratio_policy, so stretch only)
    inputs = {"x": X, "roi": None, "scales": None, "sizes": np.array([20, 5], np.int64)}
    check("Resize", inputs, {"mode": "linear", "axes": [-1, -2]}, initializers={"sizes"}, opset=18, **TOL)


def test_resize_scales_with_axes_opset18():
    inputs = {"x": X, "roi": None, "scales": np.array([0.5, 2.0], np.float32)}
    check("Resize", inputs, {"mode": "nearest", "axes": [3, 2]}, initializers={"scales"}, opset=18, exact=True)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_resize_integer_input(mode, dtype):
    data = RNG.integers(0 if dtype == np.uint8 else -100, 120, size=(1, 2, 5, 6)).astype(dtype)
    inputs = {"x": data, "roi": EMPTY, "scales": np.array([1, 1, 2, 1.5], np.float32)}
    check("Resize", inputs, {"mode": mode}, initializers={"roi", "scales"}, opset=13, exact=True)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_unchanged_shape_is_identity(mode):
    # scale 1.05 on a size-9 axis gives 9 again: onnxruntime then copies the input
    inputs = {"x": X, "roi": EMPTY, "scales": np.array([1, 1, 1.1, 1.05], np.float32)}
    check("Resize", inputs, {"mode": mode, "coordinate_transformation_mode": "asymmetric"},
          initializers={"roi", "scales"}, opset=13, exact=True)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil"])
@pytest.mark.parametrize("coordinate_mode", ["asymmetric", "tf_half_pixel_for_nn"])
def test_resize_nearest_near_ties(nearest_mode, coordinate_mode):
    # float32 coordinates one ulp off a half-integer (e.g. 8 / (16/7) = 3.4999998): onnxruntime calls them ties
    data = np.arange(2 * 3 * 5 * 9, dtype=np.float32).reshape(2, 3, 5, 9)
    for scales in ([1, 1, 16 / 7, 39 / 7], [1, 1, 1 / 7, 2 / 7], [1, 1, 14 / 13, 0.6153846]):
        inputs = {"x": data, "roi": EMPTY, "scales": np.array(scales, np.float32)}
        check("Resize", inputs, attributes("nearest", nearest_mode, coordinate_mode),
              initializers={"roi", "scales"}, opset=13, exact=True)


def test_resize_antialias_is_unsupported():
    op = Operation("r", "Resize", {"mode": "linear", "antialias": 1})
    with pytest.raises(UnsupportedOperationError):
        build_kernel(op, 18)
    with pytest.raises(UnsupportedOperationError):
        build_kernel(Operation("r", "Resize", {"mode": "bicubic"}), 13)
