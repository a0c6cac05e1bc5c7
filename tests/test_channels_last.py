"""Channels-last activations, clips inside conv kernels and folded Pads (issue 17): every result agrees
with onnxruntime running the same ONNX, and running an op fused or unfused changes no bit."""

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

import ppqlike
from ppqlike.executor.ops import _conv_channels_last, _conv_expand_chain
from onnx_helpers import make_model, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _channels_last(x: np.ndarray) -> np.ndarray:
    """The same values as ``x`` [N,C,H,W], stored channels-last."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


class _Watcher(ppqlike.OperationHook):
    """A hook that changes nothing: with it the executor runs every op on its own (no fusion, no fold)."""

    def __init__(self):
        self.seen = []

    def after_operation(self, operation, inputs, outputs):
        self.seen.append(operation.type)


def _run_both(model, feeds):
    """(fused, unfused, the op types the unfused run saw) of the executor on ``model``."""
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
    fused = executor.forward(feeds)
    watcher = _Watcher()
    unfused = executor.forward(feeds, hooks=[watcher])
    return fused, unfused, watcher.seen


def _output(name, element_type=onnx.TensorProto.FLOAT):
    """A rank-4 graph output of unknown sizes."""
    return helper.make_tensor_value_info(name, element_type, [f"{name}_{axis}" for axis in "nchw"])


def _conv_model(x, w, b, attributes):
    inputs = {"x": x, "w": w, "b": b}
    return single_node_model("Conv", inputs, attributes, initializers={"w", "b"})


# ------------------------------------------------------------------ kernels --
def test_layout_helpers():
    x = _data(2, 3, 4, 5)
    stored = _channels_last(x)
    assert _conv_channels_last.is_channels_last(stored) and not stored.flags.c_contiguous
    assert not _conv_channels_last.is_channels_last(x)
    assert _conv_channels_last.is_channels_last(_data(2, 3, 1, 1))   # either layout, when H = W = 1


@settings(max_examples=40, deadline=None)
@given(k=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       pads=st.lists(st.integers(0, 3), min_size=4, max_size=4), size=st.integers(4, 13),
       channels=st.integers(1, 9), batch=st.integers(1, 3), bias=st.booleans(), seed=st.integers(0, 99))
def test_depthwise_any_geometry_either_layout(k, stride, dilation, pads, size, channels, batch, bias, seed):
    """Every depthwise geometry, fed NCHW and channels-last: both agree with onnxruntime and each other."""
    extent = dilation * (k - 1) + 1
    if size + pads[0] + pads[2] < extent or size + 1 + pads[1] + pads[3] < extent:
        return
    x = _data(batch, channels, size, size + 1, seed=seed)
    w = _data(channels, 1, k, k, seed=seed + 1) / np.float32(k)
    b = _data(channels, seed=seed + 2) if bias else None
    attributes = dict(group=channels, strides=[stride, stride], dilations=[dilation, dilation], pads=pads)
    model = _conv_model(x, w, b, attributes)
    expected = run_onnxruntime(model, {"x": x})[0]
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
    plain = executor.forward({"x": x})[0]
    stored = executor.forward({"x": _channels_last(x)})[0]
    np.testing.assert_allclose(plain, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(plain, stored)


@pytest.mark.parametrize("ci,co,bias", [(16, 96, True), (96, 24, True), (8, 8, False), (5, 40, True)])
def test_pointwise_of_a_channels_last_input(ci, co, bias):
    """A 1x1 convolution reads a channels-last input as one matrix (the bias in the GEMM when the output
    is wide) and writes channels-last."""
    x = _data(3, ci, 9, 7, seed=1)
    w = _data(co, ci, 1, 1, seed=2) / np.float32(np.sqrt(ci))
    b = _data(co, seed=3) if bias else None
    model = _conv_model(x, w, b, {})
    expected = run_onnxruntime(model, {"x": x})[0]
    result = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).forward({"x": _channels_last(x)})[0]
    np.testing.assert_allclose(result, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("row,column", [(3, 0), (0, 7), (3, 4), (7, 6), (0, 1)])
@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_depthwise_of_a_non_finite_channels_last_input(stride, row, column, special):
    """A zero weight cancels a wrapped read only when it is finite: inf and NaN inputs in the columns whose
    reads wrap into another row take the exact path; elsewhere they are the convolution's own."""
    x = _data(2, 5, 8, 8, seed=1)
    x[0, 1, row, column] = special
    x[1, 4, 0, 5] = np.nan
    model = _conv_model(x, _data(5, 1, 3, 3, seed=2), _data(5, seed=3),
                        dict(group=5, pads=[1, 1, 1, 1], strides=[stride, stride]))
    expected = run_onnxruntime(model, {"x": x})[0]
    result = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).forward({"x": _channels_last(x)})[0]
    np.testing.assert_allclose(result, expected, rtol=RTOL, atol=ATOL)


# -------------------------------------------------------- a stack of layers --
def _mobile_block_model(clip_type: str):
    """stem 3x3 conv -> Relu -> depthwise -> Clip/Relu -> 1x1 expand -> Clip/Relu -> depthwise s2 ->
    1x1 project -> + residual of a 1x1 of the same -> MaxPool -> Concat with an AveragePool ->
    GlobalAveragePool: every layout change and every fusion of a MobileNet/SqueezeNet-like model."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        fan = int(np.prod(shape[1:]))
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32), name)

    def bias(name, n):
        return onnx.numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), name)

    initializers = [weight("w0", 8, 3, 3, 3), bias("b0", 8), weight("w1", 8, 1, 3, 3), bias("b1", 8),
                    weight("w2", 24, 8, 1, 1), bias("b2", 24), weight("w3", 24, 1, 3, 3), bias("b3", 24),
                    weight("w4", 8, 24, 1, 1), bias("b4", 8), weight("w5", 8, 8, 1, 1),
                    onnx.numpy_helper.from_array(np.array(0.0, np.float32), "low"),
                    onnx.numpy_helper.from_array(np.array(6.0, np.float32), "high")]

    def activation(source, target):
        if clip_type == "Clip":
            return helper.make_node("Clip", [source, "low", "high"], [target])
        return helper.make_node("Relu", [source], [target])
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["a0"]),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=8),
        activation("c1", "a1"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]),
        activation("c2", "a2"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2], group=24),
        helper.make_node("Conv", ["c3", "w4", "b4"], ["c4"]),
        helper.make_node("Conv", ["c4", "w5"], ["c5"]),
        helper.make_node("Add", ["c4", "c5"], ["s"]),
        helper.make_node("MaxPool", ["s"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["s"], ["v"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["m", "v"], ["j"], axis=1),
        helper.make_node("GlobalAveragePool", ["j"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 32, 32])]
    outputs = [_output("y"), _output("j")]
    return make_model(nodes, inputs, outputs, initializers)


@pytest.mark.parametrize("clip_type", ["Clip", "Relu"])
def test_layer_stack_agrees_with_onnxruntime_fused_or_not(clip_type, monkeypatch):
    from ppqlike.executor import chains as chains_module
    ran = _recorded_calls(monkeypatch, chains_module, "expand_then_depthwise")
    model = _mobile_block_model(clip_type)
    x = _data(2, 3, 32, 32, seed=4)
    expected = run_onnxruntime(model, {"x": x})
    fused, unfused, seen = _run_both(model, {"x": x})
    assert seen.count(clip_type) == (2 if clip_type == "Clip" else 3)   # unfused: every activation on its own
    plan = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).compile()
    assert len(plan.chains) == 1   # the 1x1 expansion and the stride-2 depthwise conv after it run as one kernel
    assert len(plan.projections) == 1 and len(ran) == 1 and ran[0] is not None   # and the 1x1 after it
    assert ran[0].shape[1] == 8   # the projection's result (the depthwise conv's has 24 channels)
    for got, unhooked, want in zip(fused, unfused, expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(got, unhooked)
        assert got.flags.c_contiguous   # what forward hands back is plain NCHW, whatever the layout inside


def _several_passes(block, out=None):
    """An epilogue of several passes (requantization-like), indifferent to the row width it is handed."""
    target = block if out is None else out
    np.multiply(block, np.float32(0.37), out=target)
    np.rint(target, out=target)
    target.clip(-5, 9, out=target)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", ["clip", "passes", None])
def test_expansion_epilogue_gives_the_bytes_of_the_convolutions_one_by_one(stride, kind):
    """The expansion's epilogue, however the chain runs it on the image going into the depthwise buffer (a
    clip written into the column phases as it reads; several passes on the image's rows, then the phases
    copied apart), leaves the bytes of the 1x1 and the depthwise convolution run one after the other."""
    from ppqlike.executor.fusion import clip_epilogue
    epilogue = {"clip": clip_epilogue((0.0, 6.0)), "passes": _several_passes, None: None}[kind]
    x = _channels_last(np.rint(_data(3, 8, 12, 12, seed=21) * 4))
    w1, b1 = np.rint(_data(24, 8, 1, 1, seed=22) * 3), _data(24, seed=23)
    w2, b2 = _data(24, 1, 3, 3, seed=24), _data(24, seed=25)
    geometry = ((1, 1, 1, 1), (stride, stride), (1, 1))
    chained = _conv_expand_chain.expand_then_depthwise(x, (w1, b1, epilogue), (w2, b2, None), *geometry)
    expanded = _conv_channels_last.pointwise(x, w1, b1, np.float32, epilogue)
    one_by_one = _conv_channels_last.depthwise(expanded, w2, b2, *geometry, np.float32)
    assert chained is not None and chained.tobytes() == one_by_one.tobytes()


def test_clip_inside_a_float16_conv_is_applied_after_the_cast():
    x = _data(2, 4, 6, 6, seed=1).astype(np.float16)
    w = (_data(4, 1, 3, 3, seed=2) / 3).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "low", "high"], ["y"])]
    initializers = [onnx.numpy_helper.from_array(w, "w"),
                    onnx.numpy_helper.from_array(np.array(-0.3, np.float16), "low"),
                    onnx.numpy_helper.from_array(np.array(0.7, np.float16), "high")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, list(x.shape))],
                       [_output("y", onnx.TensorProto.FLOAT16)], initializers)
    fused, unfused, _ = _run_both(model, {"x": x})
    assert fused[0].dtype == np.float16
    np.testing.assert_array_equal(fused[0], unfused[0])
    assert fused[0].max() <= np.float16(0.7) and fused[0].min() >= np.float16(-0.3)


# ----------------------------------------------------------- Pad folding --
def _pad_conv_model(pads, value=None, group=6, k=3, stride=2, extra_reader=False, expand=False,
                    constant_pads=False):
    """x -> Pad (pads computed at run time from a Shape) -> Conv "valid"; ``expand``: x first through a 1x1
    Conv and a Relu (EfficientNet's expansion); ``constant_pads``: the pads computed from constants alone
    (a ConstantOfShape), by nodes placed after the expansion, as EfficientNet-Lite0's export has them."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((6, 6 // group, k, k)) / k).astype(np.float32)
    initializers = [onnx.numpy_helper.from_array(w, "w"),
                    onnx.numpy_helper.from_array((rng.standard_normal((6, 6, 1, 1)) / 3).astype(np.float32), "we"),
                    onnx.numpy_helper.from_array(np.zeros(1, np.int64), "zeros"),
                    onnx.numpy_helper.from_array(np.array([0, 0] + pads[:2] + [0, 0] + pads[2:], np.int64),
                                                 "amounts")]
    pads_nodes = [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Slice", ["shape", "zeros", "zeros"], ["nothing"]),   # empty, at run time
                  helper.make_node("Concat", ["amounts", "nothing"], ["pads"], axis=0)]
    if constant_pads:
        pads_nodes = [helper.make_node("ConstantOfShape", ["zeros"], ["nothing"],
                                       value=onnx.numpy_helper.from_array(np.zeros(1, np.int64))),
                      pads_nodes[-1]]
    nodes = [] if constant_pads else pads_nodes
    pad_inputs = ["e" if expand else "x", "pads"]
    if expand:
        nodes += [helper.make_node("Conv", ["x", "we"], ["ec"]), helper.make_node("Relu", ["ec"], ["e"])]
    if constant_pads:
        nodes += pads_nodes
    if value is not None:
        initializers.append(onnx.numpy_helper.from_array(np.array(value, np.float32), "value"))
        pad_inputs.append("value")
    nodes += [helper.make_node("Pad", pad_inputs, ["p"], mode="constant"),
              helper.make_node("Conv", ["p", "w"], ["y"], group=group, strides=[stride, stride])]
    outputs = [_output("y")]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append(_output("r"))
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 6, 12, 12])]
    return make_model(nodes, inputs, outputs, initializers)


@pytest.mark.parametrize("pads,group,k,stride", [([0, 0, 1, 1], 6, 3, 2), ([1, 1, 2, 2], 6, 5, 2),
                                                 ([2, 2, 2, 2], 6, 5, 1), ([0, 1, 1, 0], 1, 3, 1)])
def test_zero_pad_folded_into_the_conv(pads, group, k, stride):
    model = _pad_conv_model(pads, group=group, k=k, stride=stride)
    x = _data(2, 6, 12, 12, seed=5)
    expected = run_onnxruntime(model, {"x": x})
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
    plan = executor.compile()
    assert [plan.steps[i].operation.type for i in plan.pad_folds] == ["Pad"]
    fused, unfused, seen = _run_both(model, {"x": x})
    assert "Pad" in seen
    np.testing.assert_allclose(fused[0], expected[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(fused[0], unfused[0])


@pytest.mark.parametrize("constant_pads", [False, True])
def test_expansion_pad_and_depthwise_as_one_kernel(monkeypatch, constant_pads):
    """1x1 -> Relu -> zero Pad -> "valid" depthwise: one kernel, as EfficientNet-Lite0's blocks run; also
    when the Pad's widths come from constants through nodes after the 1x1 (the plan runs those first)."""
    from ppqlike.executor import chains as chains_module
    ran = []
    original = chains_module.expand_then_depthwise
    monkeypatch.setattr(chains_module, "expand_then_depthwise",
                        lambda *arguments: ran.append(original(*arguments)) or ran[-1])
    model = _pad_conv_model([1, 1, 2, 2], k=5, expand=True, constant_pads=constant_pads)
    x = _channels_last(_data(2, 6, 12, 12, seed=13))
    expected = run_onnxruntime(model, {"x": np.ascontiguousarray(x)})
    assert len(ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).compile().chains) == 1
    fused, unfused, seen = _run_both(model, {"x": x})
    assert len(ran) == 1 and ran[0] is not None   # the fused run went through the one kernel
    assert "Pad" in seen and "Relu" in seen
    np.testing.assert_allclose(fused[0], expected[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(fused[0], unfused[0])


def test_pad_of_another_value_or_with_another_reader_is_run():
    x = _data(2, 6, 12, 12, seed=6)
    for model in (_pad_conv_model([0, 0, 1, 1], value=0.5), _pad_conv_model([1, 1, 1, 1], extra_reader=True)):
        expected = run_onnxruntime(model, {"x": x})
        result = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).forward({"x": x})
        for got, want in zip(result, expected):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert not ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(_pad_conv_model([1, 1, 1, 1], extra_reader=True))
                                     ).compile().pad_folds


# ------------------------------------------------------------------ pools --
@pytest.mark.parametrize("op_type,attributes", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 0, 1, 2], count_include_pad=0)),
    ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_pools_keep_a_channels_last_layout(op_type, attributes):
    x = _data(2, 5, 9, 8, seed=7)
    model = single_node_model(op_type, {"x": x}, attributes)
    expected = run_onnxruntime(model, {"x": x})[0]
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
    kernel = executor._kernel(next(iter(executor.graph.operations.values())))
    result = kernel([_channels_last(x)])[0]
    np.testing.assert_allclose(result, expected, rtol=RTOL, atol=ATOL)
    if op_type in ("MaxPool", "AveragePool"):
        assert _conv_channels_last.is_channels_last(result) and not result.flags.c_contiguous


def _recorded_calls(monkeypatch, module, name) -> list:
    """The results of every call of ``module.name`` from now on (the function itself still runs)."""
    results, original = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *arguments: results.append(original(*arguments)) or results[-1])
    return results


@pytest.mark.parametrize("stride,size,images", [(1, 12, 3), (2, 12, 16), (1, 28, 16), (2, 56, 4)])
def test_expansion_depthwise_and_projection_as_one_kernel_equal_the_three(stride, size, images):
    """The projection's own GEMM groups, fed from the depthwise results in cache: bit for bit the three
    convolutions one after the other, each with its clip."""
    x = _channels_last(_data(images, 6, size, size, seed=14))
    w1, b1 = _data(48, 6, 1, 1, seed=15) / np.float32(3), _data(48, seed=16)
    w2, b2 = _data(48, 1, 3, 3, seed=17) / np.float32(3), _data(48, seed=18)
    w3, b3 = _data(8, 48, 1, 1, seed=19) / np.float32(7), _data(8, seed=20)
    clip = lambda block, out=None: np.clip(block, 0, 6, out=block if out is None else out)   # noqa: E731
    separate = _conv_channels_last.pointwise(
        _conv_channels_last.depthwise(_conv_channels_last.pointwise(x, w1, b1, np.float32, clip), w2, b2,
                                      (1, 1, 1, 1), (stride, stride), (1, 1), np.float32, clip),
        w3, b3, np.float32, clip)
    joined = _conv_expand_chain.expand_then_depthwise(x, (w1, b1, clip), (w2, b2, clip), (1, 1, 1, 1),
                                                       (stride, stride), (1, 1), (w3, b3, clip))
    np.testing.assert_array_equal(joined, separate)
    assert _conv_channels_last.is_channels_last(joined)


@pytest.mark.parametrize("stride,size,bias", [(1, 12, True), (2, 12, True), (1, 7, False), (2, 16, False)])
def test_expansion_and_depthwise_as_one_kernel_equal_the_two(stride, size, bias):
    """The same GEMMs and tap groups: bit for bit the two convolutions one after the other."""
    x = _channels_last(_data(3, 6, size, size, seed=8))
    w1, b1 = _data(20, 6, 1, 1, seed=9) / np.float32(3), (_data(20, seed=10) if bias else None)
    w2, b2 = _data(20, 1, 3, 3, seed=11) / np.float32(3), _data(20, seed=12)
    clip = lambda block, out=None: np.clip(block, 0, 6, out=block if out is None else out)   # noqa: E731
    separate = _conv_channels_last.depthwise(_conv_channels_last.pointwise(x, w1, b1, np.float32, clip), w2, b2,
                                             (1, 1, 1, 1), (stride, stride), (1, 1), np.float32, clip)
    joined = _conv_expand_chain.expand_then_depthwise(x, (w1, b1, clip), (w2, b2, clip), (1, 1, 1, 1),
                                                       (stride, stride), (1, 1))
    np.testing.assert_array_equal(joined, separate)
    assert _conv_channels_last.is_channels_last(joined)
    assert _conv_expand_chain.expand_then_depthwise(np.ascontiguousarray(x), (w1, b1, clip), (w2, b2, clip),
                                                     (1, 1, 1, 1), (stride, stride), (1, 1)) is None   # NCHW input
