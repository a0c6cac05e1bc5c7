"""Opset-correct export (issue 14): models of opsets 11 and 12 export at 13 (21 for 16-bit types); ops whose
semantics changed (Softmax/LogSoftmax/Hardmax over a non-last axis, axes attributes that became inputs) are
rewritten to the same computation, checked against onnxruntime running the source model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import run_onnxruntime
from ppqlike import api
from ppqlike.optim.setting import QuantizationSettingFactory
from ppqlike.export import build_qdq_model
from ppqlike.export.verify import run_qdq_model, verify_export
from ppqlike.core.quant import is_applied

RNG = np.random.default_rng(7)
CALIB = [RNG.standard_normal((4, 3, 6, 6)).astype(np.float32) for _ in range(2)]
TEST = RNG.standard_normal((16, 3, 6, 6)).astype(np.float32)


def changed_ops_model(opset: int, softmax_is_output: bool = False) -> onnx.ModelProto:
    """Conv -> Softmax(axis=1) -> ReduceSum/Squeeze/Unsqueeze/Split with axes attributes -> LogSoftmax(axis=1),
    Hardmax(axis=1), ReduceMean: every op whose inputs or semantics changed between opset 11 and 18."""
    weight = numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    squeeze = [helper.make_node("Squeeze", ["r"], ["q"], axes=[3], name="squeeze"),
               helper.make_node("Unsqueeze", ["q"], ["u"], axes=[1], name="unsqueeze"),
               helper.make_node("Split", ["u"], ["a", "b"], axis=2, split=[3, 5], name="split")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Softmax", ["c"], ["s"], axis=1, name="softmax"),
             helper.make_node("ReduceSum", ["s"], ["r"], axes=[3], keepdims=1, name="reduce_sum"),
             *squeeze,
             helper.make_node("LogSoftmax", ["a"], ["log"], axis=1, name="log_softmax"),
             helper.make_node("Hardmax", ["b"], ["hard"], axis=2, name="hardmax"),
             helper.make_node("ReduceMean", ["log"], ["mean"], axes=[2], keepdims=0, name="reduce_mean")]
    shapes = {"mean": ["N", 1, 6], "hard": ["N", 1, 5, 6], "s": ["N", 8, 6, 6]}
    outputs = ["mean", "hard"] + (["s"] if softmax_is_output else [])
    graph = helper.make_graph(nodes, "changed_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  ["N", 3, 6, 6])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[name]) for name in outputs],
                              [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("opset")
    for opset in (11, 12):
        for as_output in (False, True):
            onnx.save(changed_ops_model(opset, as_output), str(folder / f"m{opset}_{int(as_output)}.onnx"))
    return folder


def _quantized(model_path, platform: str, opset: int = 11, softmax_is_output: bool = False, setting=None):
    """The small model quantized; the protection off by default (it may move a layer to int16, and 16-bit
    configs raise the export to opset 21, which its own test below checks)."""
    if setting is None:
        setting = QuantizationSettingFactory.for_platform(platform)
        setting.protection = False
    return api.quantize_onnx_model(str(model_path / f"m{opset}_{int(softmax_is_output)}.onnx"), CALIB,
                                   platform=platform, setting=setting)


@pytest.mark.parametrize("opset", [11, 12])
def test_float_rewrite_computes_what_the_source_computes(model_path, opset):
    """All configs off: the upgraded model run by onnxruntime equals onnxruntime on the opset-11/12 source."""
    graph = api.quantize_onnx_model(str(model_path / f"m{opset}_1.onnx"), CALIB, do_quantize=False)
    model, report = build_qdq_model(graph)
    assert report["opset"] == 13 and report["activation_pairs"] == 0
    onnx.checker.check_model(model)
    source = onnx.load(str(model_path / f"m{opset}_1.onnx"))
    expected = run_onnxruntime(source, {"x": TEST})
    exported = run_qdq_model(model, {"x": TEST}, [o.name for o in source.graph.output], "disable")
    for want, got in zip(expected, exported):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [n.op_type for n in model.graph.node].count("Flatten") == 3  # Softmax, LogSoftmax, Hardmax wrapped


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8", "ACADEMIC_INT8"])
@pytest.mark.parametrize("softmax_is_output", [False, True])
@pytest.mark.parametrize("per_consumer", [False, True])
def test_quantized_opset_11_exports_and_matches_the_simulation(model_path, platform, softmax_is_output,
                                                               per_consumer):
    graph = _quantized(model_path, platform, softmax_is_output=softmax_is_output)
    assert graph.opset == 11
    model, report = build_qdq_model(graph, qdq_per_consumer=per_consumer)
    onnx.checker.check_model(model)
    assert report["opset"] == 13 and report["activation_pairs"] > 0
    assert set(report["tensors"]) <= set(graph.variables)
    result = verify_export(graph, TEST, model=model, optimizations=("disable",))
    for name, stats in result["end_to_end"]["disable"].items():
        assert stats["within_one_step"] >= 0.999, (platform, name, stats)
        assert stats["cosine"] >= 0.9999, (platform, name, stats)


def test_sixteen_bit_configs_raise_the_export_to_opset_21(model_path):
    """A 16-bit activation needs opset 21: the Reduce ops' axes become inputs (opset 18) on the way."""
    graph = _quantized(model_path, "PPL_CUDA_INT8", opset=12)
    configs = [config for operation in graph.operations.values() if operation.config is not None
               for config in operation.config.output_quantization_config if is_applied(config.state)]
    configs[0].num_of_bits = 16  # [-32768, 32767], same scale: a finer grid for one tensor
    model, report = build_qdq_model(graph, uint8_activations=True)
    assert report["opset"] == 21
    onnx.checker.check_model(model)
    reduce_mean = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    assert len(reduce_mean.input) == 2 and not [a for a in reduce_mean.attribute if a.name == "axes"]
    result = verify_export(graph, TEST, model=model, optimizations=("disable",))
    for name, stats in result["end_to_end"]["disable"].items():
        assert stats["within_one_step"] >= 0.999, (name, stats)
