"""Conv and ConvTranspose against onnxruntime: every attribute, every fast path."""

import numpy as np
import pytest

import ppqlike
from ppqlike.core.errors import PPQLikeError
from ppqlike.executor.ops import _conv_channels_last, _conv_depthwise, _conv_fast, _threads
from onnx_helpers import assert_matches_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _weight(*shape, seed=2, fan_in=None):
    """Weights scaled by 1/sqrt(fan-in), so that outputs are of unit size and atol is meaningful."""
    fan_in = fan_in or int(np.prod(shape[1:]))
    return _data(*shape, seed=seed) / np.float32(np.sqrt(fan_in))


def _conv(x_shape, w_shape, bias=True, initializers=("w", "b"), **attributes):
    inputs = {"x": _data(*x_shape, seed=1), "w": _weight(*w_shape),
              "b": _data(w_shape[0], seed=3) if bias else None}
    return assert_matches_onnxruntime("Conv", inputs, attributes, initializers=initializers, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------ 2-D fast paths --
@pytest.mark.parametrize("ci,co,bias", [(16, 96, True), (96, 24, True), (8, 8, False), (3, 40, True)])
@pytest.mark.parametrize("size", [(9, 7), (24, 20)])     # one GEMM for the batch / one per image
@pytest.mark.parametrize("batch", [1, 3])
def test_pointwise(ci, co, bias, size, batch):
    _conv((batch, ci, *size), (co, ci, 1, 1), bias=bias)


@pytest.mark.parametrize("strides,pads", [([2, 2], [0, 0, 0, 0]), ([1, 2], [1, 0, 1, 2])])
def test_pointwise_strided_padded(strides, pads):
    _conv((2, 6, 9, 8), (5, 6, 1, 1), strides=strides, pads=pads)


@pytest.fixture(params=["default", "rows", "flat", "windows"])
def depthwise_path(request, monkeypatch):
    """Run a test under every depthwise strategy: the default choice (channels-last by tap groups where
    the geometry allows), always one row per channel over a padded NCHW copy ("rows"), always flat NCHW
    with per-position weights ("flat"), always one channels-last einsum per image ("windows")."""
    if request.param in ("rows", "flat"):
        monkeypatch.setattr(_conv_channels_last, "depthwise", lambda *arguments: None)
        monkeypatch.setattr(_conv_depthwise, "_EXPAND_BELOW", 0 if request.param == "rows" else 10 ** 9)
    elif request.param == "windows":
        monkeypatch.setattr(_conv_channels_last, "_depthwise_phases", lambda *arguments: None)
        monkeypatch.setattr(_conv_channels_last, "_WINDOWS_MIN_CHANNELS", 1)
        monkeypatch.setattr(_conv_channels_last, "_WINDOWS_MAX_MAP", 10 ** 9)
    return request.param


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("size", [7, 12, 33])
def test_depthwise(k, stride, size, depthwise_path):
    _conv((3, 10, size, size), (10, 1, k, k), group=10, strides=[stride, stride], pads=[k // 2] * 4)


@pytest.mark.parametrize("pads,strides,dilations", [
    ([0, 0, 0, 0], [1, 1], [1, 1]),
    ([2, 1, 0, 3], [2, 1], [1, 1]),
    ([1, 1, 1, 1], [3, 2], [1, 1]),
    ([2, 2, 2, 2], [1, 1], [2, 2]),
    ([3, 1, 2, 4], [2, 3], [2, 1]),
])
def test_depthwise_geometry(pads, strides, dilations, depthwise_path):
    _conv((2, 6, 13, 11), (6, 1, 3, 3), group=6, pads=pads, strides=strides, dilations=dilations)


def test_depthwise_without_bias_many_channels_and_one_image():
    # enough channels for several channel blocks, a single image (threads split blocks)
    _conv((1, 700, 9, 9), (700, 1, 3, 3), bias=False, group=700, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_large_map(stride):
    _conv((2, 4, 60, 60), (4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], strides=[stride, stride])


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 0, 0, 0]])
def test_depthwise_several_images_per_chunk(pads, monkeypatch):
    monkeypatch.setattr(_conv_channels_last, "depthwise", lambda *arguments: None)   # the NCHW kernel
    monkeypatch.setattr(_conv_depthwise, "_CHUNK", 100)  # 2 channels of 7x7 per block
    monkeypatch.setattr(_conv_depthwise, "_CHUNK_IMAGES", 300)  # 3 images per chunk, the last chunk short
    _conv((7, 5, 7, 7), (5, 1, 3, 3), group=5, pads=pads)


@pytest.mark.parametrize("k,stride,pads", [(3, 1, [1, 1, 1, 1]), (5, 2, [1, 1, 2, 2]), (3, 2, [0, 0, 1, 1]),
                                           (5, 1, [2, 1, 2, 3])])
@pytest.mark.parametrize("border_zero", [True, False])
def test_depthwise_valid_on_padded_input(k, stride, pads, border_zero, depthwise_path):
    # EfficientNet pads with an explicit Pad op, then runs a "valid" depthwise convolution
    interior = _data(2, 6, 12, 12, seed=1)
    x = np.pad(interior, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    if not border_zero:
        x[1, 3, -1, 4] = 0.5
    inputs = {"x": x, "w": _weight(6, 1, k, k), "b": _data(6, seed=3)}
    assert_matches_onnxruntime("Conv", inputs, {"group": 6, "strides": [stride, stride]},
                               initializers={"w", "b"}, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_non_finite_input(stride, depthwise_path):
    # the fast "same" path cancels padding reads with zero weights; an inf must not leak through them
    x = _data(2, 5, 8, 8, seed=1)
    x[0, 1, 3, 0] = np.inf
    x[1, 2, 7, 7] = -np.inf
    x[1, 4, 0, 5] = np.nan
    inputs = {"x": x, "w": _weight(5, 1, 3, 3), "b": _data(5, seed=3)}
    assert_matches_onnxruntime("Conv", inputs, {"group": 5, "pads": [1, 1, 1, 1], "strides": [stride, stride]},
                               initializers={"w", "b"}, rtol=RTOL, atol=ATOL)


def test_depthwise_channel_multiplier():
    _conv((2, 4, 8, 8), (12, 1, 3, 3), group=4, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("threads", [1, 3])
def test_depthwise_thread_counts(threads):
    _threads.set_num_threads(threads)
    try:
        _conv((5, 7, 10, 10), (7, 1, 3, 3), group=7, pads=[1, 1, 1, 1])
        _conv((5, 96, 14, 14), (96, 1, 5, 5), group=96, pads=[2, 2, 2, 2])   # channels-last, images split
    finally:
        _threads.set_num_threads(None)


@pytest.mark.parametrize("k,stride,bias", [(3, 1, True), (3, 2, False), (5, 1, True), (5, 2, True)])
def test_depthwise_mobile_layers_channels_last(k, stride, bias):
    """MobileNetV2 / EfficientNet-sized late layers (many channels, small maps): the default takes the
    channels-last path there."""
    _conv((4, 96, 14, 14), (96, 1, k, k), bias=bias, group=96, strides=[stride, stride], pads=[k // 2] * 4)


@pytest.mark.parametrize("ci,k,stride", [(3, 3, 2), (16, 3, 1), (32, 5, 1), (12, 3, 2)])
def test_dense(ci, k, stride):
    _conv((2, ci, 15, 14), (8, ci, k, k), strides=[stride, stride], pads=[k // 2] * 4)


@pytest.mark.parametrize("channels_last", [True, False])
def test_dense_geometry_both_layouts(channels_last, monkeypatch):
    monkeypatch.setattr(_conv_fast, "_CHANNELS_LAST_MIN", 1 if channels_last else 10 ** 6)
    _conv((2, 9, 13, 12), (7, 9, 3, 2), pads=[0, 2, 1, 1], strides=[2, 3], dilations=[2, 1])


def test_dense_batch_chunks(monkeypatch):
    monkeypatch.setattr(_conv_fast, "_PATCH_BYTES", 1)  # one image per patch matrix
    _conv((3, 8, 9, 9), (4, 8, 3, 3), pads=[1, 1, 1, 1])


@pytest.mark.parametrize("x_shape,w_shape,attributes", [
    ((2, 1, 700), (33, 1, 64), {"strides": [16]}),                                   # an STFT as a Conv
    ((3, 1, 160), (12, 1, 10), {"strides": [5], "pads": [2, 3], "dilations": [2]}),  # wav2vec's first layer
    ((2, 1, 19, 17), (6, 1, 7, 7), {"strides": [2, 2], "pads": [3, 2, 3, 1]}),       # a stem on a grey image
    ((2, 1, 9, 8), (1, 1, 3, 3), {}),
])
def test_one_input_channel(x_shape, w_shape, attributes):
    """One input channel, group 1 (a waveform, a grey image): one GEMM of its patches."""
    _conv(x_shape, w_shape, **attributes)


@pytest.mark.parametrize("group,ci,co", [(2, 8, 6), (4, 8, 8), (3, 9, 12)])
def test_grouped(group, ci, co):
    _conv((2, ci, 10, 9), (co, ci // group, 3, 3), group=group, pads=[1, 0, 1, 2], strides=[1, 2])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
@pytest.mark.parametrize("kind", ["dense", "depthwise", "pointwise"])
def test_auto_pad(auto_pad, kind):
    shapes = {"dense": ((6, 6, 4, 4), 1), "depthwise": ((6, 1, 4, 4), 6), "pointwise": ((6, 6, 1, 1), 1)}
    w_shape, group = shapes[kind]
    _conv((2, 6, 11, 10), w_shape, auto_pad=auto_pad, group=group, strides=[2, 3])


def test_kernel_shape_attribute_and_weight_as_input():
    _conv((1, 4, 8, 8), (5, 4, 3, 3), initializers=(), kernel_shape=[3, 3], pads=[1, 1, 1, 1])


# -------------------------------------------------------------- 1-D and 3-D --
@pytest.mark.parametrize("attributes", [
    {},
    {"pads": [2, 1], "strides": [2], "dilations": [2]},
    {"auto_pad": "SAME_UPPER", "strides": [2]},
])
@pytest.mark.parametrize("group", [1, 4])
def test_conv1d(attributes, group):
    _conv((2, 8, 21), (8, 8 // group, 3), group=group, **attributes)


@pytest.mark.parametrize("group", [1, 2])
def test_conv3d(group):
    _conv((2, 4, 6, 7, 5), (6, 4 // group, 3, 2, 3), group=group, pads=[1, 0, 1, 1, 1, 0],
          strides=[1, 2, 1], dilations=[1, 1, 2])


@pytest.mark.parametrize("group,w_shape", [(1, (4, 6, 3, 3)), (6, (6, 1, 3, 3)), (1, (4, 6, 1, 1))])
def test_float64_and_float16_keep_their_dtype(group, w_shape):
    # onnxruntime has no float64 Conv kernel: compare with the float32 result
    x, w = _data(2, 6, 7, 7), _weight(*w_shape)
    reference = _conv_model_run(x, w, group)
    for dtype, tol in ((np.float64, 1e-5), (np.float16, 2e-2)):
        got = _conv_model_run(x.astype(dtype), w.astype(dtype), group)
        assert got.dtype == dtype
        np.testing.assert_allclose(got.astype(np.float32), reference, rtol=tol, atol=tol)


def _conv_model_run(x, w, group):
    graph = ppqlike.Graph(opset=13)
    xv = graph.create_variable("x", shape=list(x.shape), dtype=x.dtype)
    wv = graph.create_variable("w", value=w)
    y = graph.create_variable("y")
    graph.inputs.append(xv)
    graph.outputs.append(y)
    graph.create_operation("Conv", [xv, wv], [y], attributes={"group": group, "pads": [1, 1, 1, 1]})
    return ppqlike.NumpyExecutor(graph).forward({"x": x})[0]


def test_inputs_not_modified_and_noncontiguous_input():
    x = _data(2, 9, 8, 6).transpose(0, 1, 3, 2)  # a view, as a Transpose kernel would return
    w, b = _data(9, 1, 3, 3), _data(9)
    keep = x.copy(), w.copy(), b.copy()
    model = single_node_model("Conv", {"x": np.ascontiguousarray(x), "w": w, "b": b},
                              {"group": 9, "pads": [1, 1, 1, 1]}, initializers={"w", "b"})
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
    got = executor.forward({"x": x})[0]
    want = executor.forward({"x": np.ascontiguousarray(x)})[0]
    np.testing.assert_array_equal(got, want)
    for before, after in zip(keep, (x, w, b)):
        np.testing.assert_array_equal(before, after)


def test_group_mismatch_is_reported():
    graph = ppqlike.Graph(opset=13)
    x = graph.create_variable("x", shape=[1, 6, 5, 5], dtype=np.float32)
    w = graph.create_variable("w", value=_data(4, 4, 3, 3))
    y = graph.create_variable("y")
    graph.inputs.append(x)
    graph.outputs.append(y)
    graph.create_operation("Conv", [x, w], [y], attributes={"group": 2})
    with pytest.raises(PPQLikeError, match="group"):
        ppqlike.NumpyExecutor(graph).forward({"x": _data(1, 6, 5, 5)})


# ------------------------------------------------------------ ConvTranspose --
def _deconv(x_shape, w_shape, bias=True, **attributes):
    inputs = {"x": _data(*x_shape, seed=4), "w": _weight(*w_shape, seed=5, fan_in=w_shape[0] * 4),
              "b": _data(w_shape[1] * attributes.get("group", 1), seed=6) if bias else None}
    return assert_matches_onnxruntime("ConvTranspose", inputs, attributes, initializers={"w", "b"},
                                      rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("attributes", [
    {},
    {"strides": [2, 2]},
    {"strides": [2, 3], "pads": [1, 0, 2, 1]},
    {"strides": [2, 2], "output_padding": [1, 0]},
    {"strides": [3, 2], "dilations": [2, 1], "pads": [1, 1, 0, 0], "output_padding": [1, 1]},
    {"strides": [2, 2], "output_shape": [13, 12]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 1], "auto_pad": "VALID"},
])
def test_conv_transpose_2d(attributes):
    _deconv((2, 3, 6, 5), (3, 4, 3, 3), **attributes)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_groups(bias):
    _deconv((2, 6, 5, 5), (6, 2, 3, 2), bias=bias, group=3, strides=[2, 2], pads=[1, 0, 0, 1])


def test_conv_transpose_1d_and_3d():
    _deconv((2, 3, 9), (3, 2, 4), strides=[3], output_padding=[2])
    _deconv((1, 2, 4, 3, 5), (2, 3, 2, 3, 2), strides=[2, 1, 2], pads=[0, 1, 0, 0, 1, 1])


@pytest.mark.parametrize("w_shape, attributes", [
    ((3, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),          # the ViT decoder's upsampling
    ((3, 4, 2, 2), {"strides": [2, 2]}),                                # no overlap: one tap per phase
    ((3, 2, 6, 4), {"strides": [3, 2], "pads": [2, 1, 1, 0]}),
    ((3, 4, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((3, 4, 4, 2), {"strides": [2, 1], "output_shape": [12, 6]}),
    ((6, 2, 4, 4), {"strides": [2, 2], "pads": [1, 2, 0, 1], "group": 3}),
    ((3, 4, 4, 4), {"strides": [2, 2], "pads": [3, 3, 2, 2]}),          # a crop no padding expresses
    ((6, 1, 2, 2), {"strides": [2, 2], "group": 6}),                    # depthwise 2x2 upsampling (DBNet's head)
    ((6, 2, 2, 2), {"strides": [2, 2], "group": 3}),                    # grouped, one tap per phase
])
def test_conv_transpose_by_sub_pixel_phases(w_shape, attributes):
    """Kernels whose sides are multiples of the strides run as one convolution per output phase (the
    crop as its padding, the bias in its GEMM); crops too deep for that take the scatter path."""
    _deconv((2, w_shape[0], 6, 5), w_shape, **attributes)


def test_conv_transpose_depthwise_upsampling_without_bias():
    _deconv((2, 6, 7, 5), (6, 1, 2, 2), bias=False, strides=[2, 2], group=6)


@pytest.mark.parametrize("threads", [2, 3])
def test_conv_transpose_split_over_threads(threads):
    _threads.set_num_threads(threads)
    try:   # the ViT decoder's geometry, fewer channels; images split over the threads
        _deconv((5, 8, 7, 7), (8, 4, 4, 4), strides=[2, 2], pads=[1, 1, 1, 1])
        _deconv((3, 6, 5, 5), (6, 2, 3, 2), group=3, strides=[2, 2], pads=[1, 0, 0, 1])
    finally:
        _threads.set_num_threads(None)
