"""The dispatcher: SOI analysis, the four strategies, pinning, boundaries, platform names."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from shared_bench import BENCH_DIR

import ppqlike
from ppqlike.core.errors import PlatformError
from ppqlike.platforms import (DISPATCHERS, SOI_INPUTS, TargetPlatform, dispatch_graph, is_quantized_platform,
                               quantization_boundaries)

TRT, FP32, SOI = TargetPlatform.TRT_INT8, TargetPlatform.FP32, TargetPlatform.SOI
I64 = np.int64


def _init(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _node(op_type, inputs, outputs, name, **attributes):
    return helper.make_node(op_type, inputs, outputs, name=name, **attributes)


def _load(nodes, inputs, outputs, initializers):
    return ppqlike.load_onnx_graph(make_model(nodes, inputs, outputs, initializers, opset=13))


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def shape_graph():
    """EfficientNet-style padding, Shape-arithmetic Pad, Resize with computed sizes, flatten, TopK with computed k."""
    rng = np.random.default_rng(0)
    inits = [
        _init("c4", [4], I64), _init("p_static", [0, 1, 0, 1], I64), _init("shape_m1_2", [-1, 2], I64),
        _init("sl_start", [-1], I64), _init("sl_end", [-(2 ** 63) + 1], I64), _init("sl_axis", [0], I64),
        _init("sl_step", [-1], I64), _init("shape_m1", [-1], I64), _init("zero", 0.0),
        _init("w1", rng.normal(size=(4, 3, 3, 3))), _init("b1", np.zeros(4)),
        _init("idx2", [2], I64), _init("c10", [10], I64), _init("zeros6", [0] * 6, I64),
        _init("s0", [0], I64), _init("s2", [2], I64), _init("s4", [4], I64), _init("two", [2], I64),
        _init("w2", rng.normal(size=(4, 4, 1, 1))), _init("idx0", 0, I64), _init("axes0", [0], I64),
        _init("idx1", [1], I64), _init("c100", [100], I64), _init("w3", rng.normal(size=(16, 5))),
    ]
    nodes = [
        _node("ConstantOfShape", ["c4"], ["cos_out"], "cos",
              value=helper.make_tensor("v", TensorProto.INT64, [1], [0])),
        _node("Concat", ["p_static", "cos_out"], ["pcat_out"], "pcat", axis=0),
        _node("Reshape", ["pcat_out", "shape_m1_2"], ["pr_out"], "pr"),
        _node("Slice", ["pr_out", "sl_start", "sl_end", "sl_axis", "sl_step"], ["psl_out"], "psl"),
        _node("Transpose", ["psl_out"], ["ptr_out"], "ptr", perm=[1, 0]),
        _node("Reshape", ["ptr_out", "shape_m1"], ["pr1_out"], "pr1"),
        _node("Cast", ["pr1_out"], ["pcast_out"], "pcast", to=TensorProto.INT64),
        _node("Pad", ["x", "pcast_out", "zero"], ["pad0_out"], "pad0"),
        _node("Conv", ["pad0_out", "w1", "b1"], ["conv1_out"], "conv1", pads=[1, 1, 1, 1]),
        _node("Relu", ["conv1_out"], ["relu1_out"], "relu1"),
        _node("Shape", ["relu1_out"], ["s1_out"], "s1"),
        _node("Gather", ["s1_out", "idx2"], ["h_out"], "h", axis=0),
        _node("Sub", ["c10", "h_out"], ["rem_out"], "rem"),
        _node("Concat", ["zeros6", "rem_out", "rem_out"], ["pads2_out"], "pads2", axis=0),
        _node("Pad", ["relu1_out", "pads2_out", "zero"], ["pad2_out"], "pad2"),
        _node("Shape", ["pad2_out"], ["shp2_out"], "shp2"),
        _node("Slice", ["shp2_out", "s0", "s2"], ["nc_out"], "nc"),
        _node("Slice", ["shp2_out", "s2", "s4"], ["hw_out"], "hw"),
        _node("Mul", ["hw_out", "two"], ["hw2_out"], "hw2"),
        _node("Concat", ["nc_out", "hw2_out"], ["sizes_out"], "sizes", axis=0),
        _node("Resize", ["pad2_out", "", "", "sizes_out"], ["rs_out"], "rs", mode="nearest"),
        _node("Conv", ["rs_out", "w2"], ["conv2_out"], "conv2"),
        _node("Shape", ["conv2_out"], ["s3_out"], "s3"),
        _node("Gather", ["s3_out", "idx0"], ["g3_out"], "g3", axis=0),
        _node("Unsqueeze", ["g3_out", "axes0"], ["u3_out"], "u3"),
        _node("Concat", ["u3_out", "shape_m1"], ["c3_out"], "c3", axis=0),
        _node("Reshape", ["conv2_out", "c3_out"], ["flat_out"], "flat"),
        _node("Shape", ["flat_out"], ["s4_out"], "s4n"),
        _node("Gather", ["s4_out", "idx1"], ["n4_out"], "n4", axis=0),
        _node("Div", ["n4_out", "c100"], ["k_out"], "k"),
        _node("TopK", ["flat_out", "k_out"], ["values", "indices"], "topk", axis=-1),
        _node("Gemm", ["values", "w3"], ["y"], "gemm"),
    ]
    outputs = [_float("y", [1, 5]), helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 16])]
    return _load(nodes, [_float("x", [1, 3, 8, 8])], outputs, inits)


SHAPE_GRAPH_SOI = {"cos", "pcat", "pr", "psl", "ptr", "pr1", "pcast", "s1", "h", "rem", "pads2", "shp2", "nc",
                   "hw", "hw2", "sizes", "s3", "g3", "u3", "c3", "s4n", "n4", "k"}
SHAPE_GRAPH_DATA = {"pad0", "conv1", "relu1", "pad2", "rs", "conv2", "flat", "topk", "gemm"}


def mixed_graph():
    """Quantizable (Conv, Add, Mul, Relu) and other ops mixed; 'wr' reshapes a constant weight (data-free)."""
    rng = np.random.default_rng(1)
    inits = [_init("p0", np.ones((1, 2, 1, 1))), _init("w", rng.normal(size=(2, 2, 1, 1))),
             _init("wflat", rng.normal(size=4)), _init("wshape", [2, 2, 1, 1], I64)]
    nodes = [
        _node("Reshape", ["wflat", "wshape"], ["wr_out"], "wr"),
        _node("Add", ["x", "p0"], ["add0_out"], "add0"),
        _node("Conv", ["add0_out", "w"], ["conv1_out"], "conv1"),
        _node("Sigmoid", ["conv1_out"], ["sig_out"], "sig"),
        _node("Mul", ["conv1_out", "sig_out"], ["mul_out"], "mul"),
        _node("Transpose", ["mul_out"], ["tr_out"], "tr", perm=[0, 1, 3, 2]),
        _node("Conv", ["tr_out", "w"], ["conv2_out"], "conv2"),
        _node("Softmax", ["conv2_out"], ["sm_out"], "sm", axis=1),
        _node("Relu", ["sm_out"], ["relu_out"], "relu"),
        _node("Conv", ["relu_out", "wr_out"], ["conv3_out"], "conv3"),
        _node("Identity", ["conv3_out"], ["y"], "idn"),
    ]
    return _load(nodes, [_float("x", [1, 2, 4, 4])], [_float("y", [1, 2, 4, 4])], inits)


MIXED_TYPES = {"Conv", "Add", "Mul", "Relu"}
MIXED_EXPECTED = {  # op names dispatched to TARGET; every other op is FP32 (no SOI in this graph)
    "conservative": {"conv1", "conv2", "conv3", "idn"},
    "aggressive": {"conv1", "mul", "tr", "conv2", "conv3", "idn"},
    "pointwise": {"add0", "conv1", "mul", "conv2", "relu", "conv3"},
    "allin": {"add0", "conv1", "sig", "mul", "tr", "conv2", "sm", "relu", "conv3", "idn"},
}


def generator_graph():
    """NonZero reads real data (its producer stays data); an Identity read only by Shape is SOI; Pad value is data."""
    inits = [_init("pads", [0, 0, 1, 1, 0, 0, 1, 1], I64)]
    nodes = [
        _node("Relu", ["x"], ["relu_out"], "relu"),
        _node("NonZero", ["relu_out"], ["nz_out"], "nz"),
        _node("Transpose", ["nz_out"], ["nzt_out"], "nzt", perm=[1, 0]),
        _node("GatherND", ["x", "nzt_out"], ["y1"], "gnd"),
        _node("Identity", ["relu_out"], ["idn_out"], "idn"),
        _node("Shape", ["idn_out"], ["shp_out"], "shp"),
        _node("Reshape", ["relu_out", "shp_out"], ["y2"], "rsh"),
        _node("ReduceMin", ["x"], ["cv_out"], "cv", keepdims=0),
        _node("Pad", ["relu_out", "pads", "cv_out"], ["y3"], "pad"),
    ]
    outputs = [_float("y1", ["n"]), _float("y2", [1, 2, 3, 3]), _float("y3", [1, 2, 5, 5])]
    return _load(nodes, [_float("x", [1, 2, 3, 3])], outputs, inits)


def labels(graph):
    return {op.name: op.platform for op in graph.operations.values()}


# --------------------------------------------------------------------------------------- SOI region --
def test_shape_graph_soi_labels_are_exact():
    graph = shape_graph()
    assert set(graph.operations) == SHAPE_GRAPH_SOI | SHAPE_GRAPH_DATA
    summary = dispatch_graph(graph, "trt_int8", {"Conv", "Gemm"}, "pointwise")
    assert set(summary["SOI"]) == SHAPE_GRAPH_SOI
    assert summary["counts"] == {"TARGET": 3, "FP32": 6, "SOI": len(SHAPE_GRAPH_SOI)}


@pytest.mark.parametrize("dispatcher", sorted(DISPATCHERS))
def test_soi_is_never_target_whatever_the_strategy(dispatcher):
    graph = shape_graph()
    every_type = {op.type for op in graph.operations.values()}  # even Shape, Gather, Cast "quantizable"
    dispatch_graph(graph, TRT, every_type, dispatcher)
    got = labels(graph)
    assert {name for name, label in got.items() if label is SOI} == SHAPE_GRAPH_SOI
    if dispatcher in ("aggressive", "pointwise", "allin"):
        assert all(got[name] is TRT for name in SHAPE_GRAPH_DATA)
    else:  # conservative: the first Pad reads the graph input, everything downstream is quantized
        assert got["pad0"] is FP32 and all(got[name] is TRT for name in SHAPE_GRAPH_DATA - {"pad0"})


def test_generator_data_inputs_identity_for_shape_and_pad_value():
    graph = generator_graph()
    summary = dispatch_graph(graph, "ORT_INT8", {"Relu", "Pad", "Reshape", "ReduceMin", "GatherND"}, "allin")
    assert set(summary["SOI"]) == {"nz", "nzt", "idn", "shp"}
    assert set(summary["TARGET"]) == {"relu", "gnd", "rsh", "cv", "pad"}  # cv feeds Pad's value: not SOI


def test_soi_slot_table():
    assert SOI_INPUTS["Pad"] == {1, 3} and 2 not in SOI_INPUTS["Pad"]
    assert SOI_INPUTS["Reshape"] == {1} and SOI_INPUTS["Resize"] == {1, 2, 3}
    assert SOI_INPUTS["Slice"] == {1, 2, 3, 4} and SOI_INPUTS["Range"] == {0, 1, 2}
    with pytest.raises(TypeError):
        SOI_INPUTS["Conv"] = frozenset({1})


def test_dispatch_writes_only_op_platform():
    graph = shape_graph()
    revision = graph.revision
    dispatch_graph(graph, TRT, {"Conv", "Gemm", "Relu"})
    assert graph.revision == revision
    assert all(op.config is None and op.platform is not None for op in graph.operations.values())


# ----------------------------------------------------------------------------------------- strategies --
@pytest.mark.parametrize("dispatcher", sorted(MIXED_EXPECTED))
def test_strategies_on_a_mixed_graph(dispatcher):
    graph = mixed_graph()
    summary = dispatch_graph(graph, TRT, MIXED_TYPES, dispatcher)
    target = MIXED_EXPECTED[dispatcher]
    assert set(summary["TARGET"]) == target
    assert set(summary["FP32"]) == set(graph.operations) - target  # 'wr' is data-free: FP32 even for allin
    assert "wr" in summary["FP32"] and summary["SOI"] == []
    assert summary["platform"] == "TRT_INT8" and summary["dispatcher"] == dispatcher


def test_boundaries_of_the_conservative_mixed_graph():
    graph = mixed_graph()
    dispatch_graph(graph, TRT, MIXED_TYPES)
    found = [(v.name, a.name, b.name) for v, a, b in quantization_boundaries(graph)]
    assert set(found) == {("add0_out", "add0", "conv1"), ("conv1_out", "conv1", "sig"),
                          ("conv1_out", "conv1", "mul"), ("tr_out", "tr", "conv2"),
                          ("conv2_out", "conv2", "sm"), ("relu_out", "relu", "conv3"),
                          ("wr_out", "wr", "conv3")}
    assert len(found) == len(set(found))


def test_boundaries_skip_shape_slots_and_soi_unless_asked():
    graph = generator_graph()
    dispatch_graph(graph, TRT, {"Relu", "Reshape"}, "pointwise")
    found = {(v.name, a.name, b.name) for v, a, b in quantization_boundaries(graph)}
    assert found == {("relu_out", "relu", "pad")}  # not relu->shp (a shape read), not shp->rsh (shape slot)
    with_soi = {(v.name, a.name, b.name) for v, a, b in quantization_boundaries(graph, include_soi=True)}
    assert with_soi == found | {("relu_out", "relu", "nz"), ("relu_out", "relu", "idn")}


def test_boundaries_need_a_dispatched_graph():
    with pytest.raises(PlatformError, match="dispatch_graph"):
        quantization_boundaries(mixed_graph())


# ------------------------------------------------------------------------------------------- pinning --
def test_dispatching_table_pins_ops():
    graph = mixed_graph()
    table = {"conv2": "FP32", "sig": TargetPlatform.TRT_INT8, "relu": "target", "add0": TargetPlatform.FP32}
    summary = dispatch_graph(graph, TRT, MIXED_TYPES, dispatching_table=table)
    got = labels(graph)
    assert got["conv2"] is FP32 and got["sig"] is TRT and got["relu"] is TRT
    assert got["mul"] is TRT and got["tr"] is TRT  # now every value they read comes from TARGET ops
    assert got["sm"] is FP32
    assert summary["pinned"] == {"conv2": "FP32", "sig": "TARGET", "relu": "TARGET", "add0": "FP32"}


def test_dispatching_table_errors():
    graph = shape_graph()
    with pytest.raises(PlatformError, match="'nope'"):
        dispatch_graph(graph, TRT, {"Conv"}, dispatching_table={"nope": "FP32", "conv1": "FP32"})
    with pytest.raises(PlatformError, match="'s1'.*never quantized"):
        dispatch_graph(graph, TRT, {"Conv"}, dispatching_table={"s1": "TARGET"})
    with pytest.raises(PlatformError, match="ORT_INT8"):
        dispatch_graph(graph, TRT, {"Conv"}, dispatching_table={"conv1": "ORT_INT8"})
    with pytest.raises(PlatformError, match="'bogus'"):
        dispatch_graph(graph, TRT, {"Conv"}, dispatching_table={"conv1": "bogus"})
    dispatch_graph(graph, TRT, {"Conv"}, dispatching_table={"s1": "fp32", "conv2": "SOI"})
    assert graph.operations["s1"].platform is FP32 and graph.operations["conv2"].platform is SOI


# ------------------------------------------------------------------------------------ platform names --
def test_target_platform_parse_and_errors():
    assert TargetPlatform.parse("trt_int8") is TargetPlatform.TRT_INT8
    assert TargetPlatform.parse(" Ort-Int8 ") is TargetPlatform.ORT_INT8
    assert TargetPlatform.parse(TargetPlatform.SOI) is TargetPlatform.SOI
    assert is_quantized_platform("academic_w4a8") and not is_quantized_platform(TargetPlatform.FP32)
    assert not is_quantized_platform("SOI") and not is_quantized_platform("unspecified")
    with pytest.raises(PlatformError) as error:
        TargetPlatform.parse("tensorrt")
    assert all(p.name in str(error.value) for p in TargetPlatform if p.is_quantized)
    assert "UNSPECIFIED" not in str(error.value)  # internal labels are not offered to users


def test_dispatch_argument_errors():
    graph = mixed_graph()
    with pytest.raises(PlatformError, match="TRT_INT8.*ORT_INT8"):
        dispatch_graph(graph, "nope_int8", MIXED_TYPES)
    with pytest.raises(PlatformError, match="not a quantized platform"):
        dispatch_graph(graph, "fp32", MIXED_TYPES)
    with pytest.raises(PlatformError, match="conservative, aggressive, pointwise, allin"):
        dispatch_graph(graph, TRT, MIXED_TYPES, dispatcher="greedy")
    with pytest.raises(PlatformError, match="collection of op types"):
        dispatch_graph(graph, TRT, "Conv")


# -------------------------------------------------------------------------------------- real models --
REAL_TYPES = {"Conv", "Gemm", "MatMul", "Add", "Relu", "Clip", "Concat", "MaxPool", "AveragePool",
              "GlobalAveragePool", "Pad", "Reshape", "Flatten", "Transpose"}  # Softmax left out on purpose


@pytest.fixture(scope="module", params=["efficientnet_lite0", "mobilenetv2", "squeezenet1.1"])
def real_graph(request):
    path = BENCH_DIR / "models" / f"{request.param}.onnx"
    if not path.is_file():
        pytest.skip(f"shared benchmark model {path} is absent (it lives outside the repository, "
                    "see ../shared/bench/README.md)")
    return request.param, ppqlike.load_onnx_graph(path)


@pytest.mark.real_model
def test_real_models_soi_never_target(real_graph):
    name, graph = real_graph
    soi = None
    for dispatcher in DISPATCHERS:
        summary = dispatch_graph(graph, TRT, REAL_TYPES, dispatcher)
        assert sum(summary["counts"].values()) == len(graph.operations)
        assert soi is None or set(summary["SOI"]) == soi  # the SOI region does not depend on the strategy
        soi = set(summary["SOI"])
        assert not any(graph.operations[n].platform is TRT for n in soi)


@pytest.mark.real_model
def test_real_models_conservative_labels(real_graph):
    name, graph = real_graph
    summary = dispatch_graph(graph, TRT, REAL_TYPES)
    ops = list(graph.operations.values())
    by_type = lambda *types: [op for op in ops if op.type in types]  # noqa: E731
    assert all(op.platform is TRT for op in by_type("Conv", "Gemm", "MatMul"))
    if name == "efficientnet_lite0":
        shape_path = [op for op in ops if op.type != "Pad" and (
            "static_padding" in op.name or op.type in ("Shape", "Gather", "ConstantOfShape", "Cast", "Unsqueeze"))]
        assert len(shape_path) == 17 * 7 + 3
        assert all(op.platform is SOI for op in shape_path)
        assert all(op.platform is not SOI for op in by_type("Pad"))
        head = [op for op in by_type("Reshape", "Concat") if "static_padding" not in op.name]
        assert {op.type: op.platform for op in head} == {"Reshape": TRT, "Concat": SOI}
        assert summary["counts"] == {"TARGET": 110, "FP32": 1, "SOI": 123}
        assert summary["FP32"] == ["/_conv_stem/static_padding/Pad"]  # reads the graph input
    elif name == "mobilenetv2":
        assert all(op.platform is SOI for op in by_type("Shape", "Gather", "Unsqueeze", "Concat"))
        reshape, = by_type("Reshape")
        assert reshape.platform is TRT and reshape.inputs[1].producer.platform is SOI
        shape_only_identity = by_type("Shape")[0].inputs[0].producer
        assert shape_only_identity.type == "Identity" and shape_only_identity.platform is SOI
        assert summary["counts"] == {"TARGET": 119, "FP32": 1, "SOI": 5}
    else:
        assert summary["counts"] == {"TARGET": 66, "FP32": 1, "SOI": 0}
        assert summary["FP32"] == [by_type("Softmax")[0].name]
        (variable, source, sink), = quantization_boundaries(graph)
        assert (source.type, sink.type) == ("Flatten", "Softmax")
