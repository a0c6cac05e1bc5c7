"""NonMaxSuppression, RoiAlign (opsets 10 and 16), MaxRoiPool and MaxUnpool against onnxruntime."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime, run_executor, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5


def _boxes(rng, batch, count, center):
    if center:
        centre = rng.uniform(0, 10, (batch, count, 2))
        size = rng.uniform(0.5, 4, (batch, count, 2))
        return np.concatenate([centre, size], axis=2).astype(np.float32)
    corners = rng.uniform(0, 10, (batch, count, 4))
    flipped = rng.random((batch, count)) < 0.3      # [y2, x2, y1, x1]: any corner order is a box
    corners[flipped] = corners[flipped][:, [2, 3, 0, 1]]
    return corners.astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 2), classes=st.integers(1, 3), count=st.integers(1, 40), center=st.sampled_from([0, 1]),
       limit=st.one_of(st.none(), st.integers(0, 50)), iou=st.one_of(st.none(), st.floats(0, 1, width=32)),
       threshold=st.one_of(st.none(), st.floats(-0.5, 0.875, width=32)), seed=st.integers(0, 2 ** 16),
       ties=st.booleans())
def test_non_max_suppression(batch, classes, count, center, limit, iou, threshold, seed, ties):
    rng = np.random.default_rng(seed)
    scores = rng.random((batch, classes, count)).astype(np.float32)
    if ties:
        scores = np.round(scores * 4) / 4     # equal scores: lower box index first
    inputs = {"boxes": _boxes(rng, batch, count, center), "scores": scores}
    optional = {"limit": None if limit is None else np.array([limit], np.int64),
                "iou": None if iou is None else np.array([iou], np.float32),
                "threshold": None if threshold is None else np.array([threshold], np.float32)}
    last = max([i for i, v in enumerate(optional.values()) if v is not None], default=-1)
    inputs.update(list(optional.items())[:last + 1])
    assert_matches_onnxruntime("NonMaxSuppression", inputs, {"center_point_box": center}, opset=11,
                               initializers={"limit", "iou", "threshold"})


def test_non_max_suppression_flipped_corners_and_duplicates():
    boxes = np.array([[[0, 0, 1, 1], [1, 1, 0, 0], [0, 0.1, 1, 1.1], [5, 5, 6, 6], [5, 5, 6, 6]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.85, 0.3, 0.3]]], np.float32)
    y = assert_matches_onnxruntime("NonMaxSuppression", {"boxes": boxes, "scores": scores,
                                                         "limit": np.array([10], np.int64),
                                                         "iou": np.array([0.5], np.float32)},
                                   opset=11, initializers={"limit", "iou"})[0]
    assert y[:, 2].tolist() == [0, 3]


def _roi_inputs(rng, n, c, h, w, rois, scale):
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    corners = rng.uniform(-2, max(h, w) + 2, (rois, 4)) / scale
    corners[:, 2:] = corners[:, :2] + np.abs(corners[:, 2:] - corners[:, :2]) * rng.uniform(0.2, 1.2, (rois, 2))
    tiny = rng.random(rois) < 0.2                   # rois under a pixel (forced to 1 x 1 before half_pixel)
    corners[tiny, 2:] = corners[tiny, :2] + 0.3 / scale
    return {"x": x, "rois": corners.astype(np.float32), "batch": rng.integers(0, n, rois).astype(np.int64)}


@pytest.mark.parametrize("opset,coordinates", [(11, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9), rois=st.integers(1, 4),
       out=st.tuples(st.integers(1, 4), st.integers(1, 4)), ratio=st.integers(0, 3),
       scale=st.sampled_from([1.0, 0.5, 0.25]), seed=st.integers(0, 2 ** 16))
def test_roi_align(opset, coordinates, mode, n, c, h, w, rois, out, ratio, scale, seed):
    attributes = {"mode": mode, "output_height": out[0], "output_width": out[1], "sampling_ratio": ratio,
                  "spatial_scale": scale}
    if coordinates is not None:
        attributes["coordinate_transformation_mode"] = coordinates
    inputs = _roi_inputs(np.random.default_rng(seed), n, c, h, w, rois, scale)
    assert_matches_onnxruntime("RoiAlign", inputs, attributes, opset=opset, rtol=RTOL, atol=ATOL)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(2, 10), w=st.integers(2, 10), rois=st.integers(1, 4),
       pooled=st.tuples(st.integers(1, 4), st.integers(1, 4)), scale=st.sampled_from([1.0, 0.5]),
       seed=st.integers(0, 2 ** 16))
def test_max_roi_pool(n, c, h, w, rois, pooled, scale, seed):
    """Positive features: onnxruntime starts each bin's maximum at FLT_MIN (1.2e-38), not -inf, so bins of
    negative values give 1.2e-38 there; the executor takes the true maximum (see the next test)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 5, (n, c, h, w)).astype(np.float32)
    corners = rng.uniform(-1, max(h, w), (rois, 4)) / scale
    corners[:, 2:] = corners[:, :2] + np.abs(corners[:, 2:]) * rng.uniform(0, 1, (rois, 2))
    roi = np.concatenate([rng.integers(0, n, (rois, 1)), corners], axis=1).astype(np.float32)
    assert_matches_onnxruntime("MaxRoiPool", {"x": x, "rois": roi}, {"pooled_shape": list(pooled),
                                                                      "spatial_scale": scale}, opset=21, exact=True)


def test_max_roi_pool_negative_values_take_the_true_maximum():
    x = -np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    roi = np.array([[0, 0, 0, 3, 3]], np.float32)
    model = single_node_model("MaxRoiPool", {"x": x, "rois": roi}, {"pooled_shape": [2, 2]}, opset=21)
    y = run_executor(model, {"x": x, "rois": roi})[0]
    assert y.ravel().tolist() == [-1, -3, -9, -11]   # the largest of each 2 x 2 quarter


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), spatial=st.lists(st.integers(2, 7), min_size=1, max_size=3),
       kernel=st.integers(1, 3), stride=st.integers(1, 3), with_shape=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_max_unpool(n, c, spatial, kernel, stride, with_shape, seed):
    """Values and indices from onnxruntime's MaxPool, unpooled in both."""
    spatial = [max(d, kernel) for d in spatial]
    x = np.random.default_rng(seed).standard_normal([n, c] + spatial).astype(np.float32)
    pool = {"kernel_shape": [kernel] * len(spatial), "strides": [stride] * len(spatial)}
    values, indices = run_onnxruntime(single_node_model("MaxPool", {"x": x}, pool, n_outputs=2, opset=12), {"x": x})
    inputs = {"values": values, "indices": indices}
    if with_shape or any((d - kernel) % stride for d in spatial):  # windows left part of the input out
        inputs["shape"] = np.array(x.shape, np.int64)
    assert_matches_onnxruntime("MaxUnpool", inputs, pool, opset=11, initializers={"shape"}, exact=True)
