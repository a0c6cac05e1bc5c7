"""QDQ export on a small hand-made graph: the exported model, run in onnxruntime, computes what the
executor simulates; exactly the simulated quantization points are written; files are safe."""

from __future__ import annotations

import hashlib
import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import fused_kernels_are_exact, make_model
from ppqlike import api
from ppqlike.core.errors import ExportError
from ppqlike.core.quant import QuantizationStates, is_applied
from ppqlike.executor import NumpyExecutor
from ppqlike.export import ExportRoundingWarning, build_qdq_model, export_qdq_onnx, output_steps
from ppqlike.export.common import is_param_slot, iter_configs, quantizes
from ppqlike.export.verify import compare_outputs, run_qdq_model, verify_export
from ppqlike.optim.setting import QuantizationSetting, QuantizationSettingFactory

S = QuantizationStates
RNG_SEED = 7


def small_model(opset: int = 13) -> onnx.ModelProto:
    """Conv/Relu, two Conv/Clip branches sharing Clip bounds, Add, a Conv sharing a weight, Concat,
    MaxPool, Transpose, Flatten, Gemm; dynamic batch."""
    rng = np.random.default_rng(RNG_SEED)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", 8, 3, 3, 3), init("b1", 8, scale=0.1), init("wa", 8, 8, 1, 1), init("ba", 8, scale=0.1),
             init("wb", 8, 8, 3, 3, scale=0.15), init("bb", 8, scale=0.1), init("w3", 10, 256, scale=0.05),
             init("b3", 10, scale=0.1),
             numpy_helper.from_array(np.array(0.0, np.float32), "cmin"),
             numpy_helper.from_array(np.array(6.0, np.float32), "cmax")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "wa", "ba"], ["ca"], name="conva"),
        helper.make_node("Clip", ["ca", "cmin", "cmax"], ["a"], name="clipa"),
        helper.make_node("Conv", ["r1", "wb", "bb"], ["cb"], name="convb", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["cb", "cmin", "cmax"], ["b"], name="clipb"),
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Conv", ["s", "wa", "ba"], ["c"], name="convc"),
        helper.make_node("Concat", ["c", "r1"], ["cat"], name="concat", axis=1),
        helper.make_node("MaxPool", ["cat"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["p"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
        helper.make_node("Flatten", ["t"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="gemm", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
    return make_model(nodes, [x], [y], inits, opset=opset)


def data(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 3, 8, 8)).astype(np.float32)


CALIB = [data(8, 1), data(8, 2)]
TEST = data(32, 3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export_small")
    onnx.save(small_model(), str(folder / "small.onnx"))
    onnx.save(small_model(opset=11), str(folder / "small11.onnx"))
    return folder


_CACHE: dict = {}


def quantized(model_dir, platform: str, setting: QuantizationSetting | None = None, name: str = "small.onnx"):
    """The small model quantized for ``platform``; by default with the protection off and the outputs
    quantized, so that every op stays quantized (tests/test_protection.py exports protected models,
    tests/test_float_outputs.py float outputs)."""
    if setting is None:
        setting = QuantizationSettingFactory.for_platform(platform)
        setting.protection = setting.float_outputs = False
    key = (platform, str(setting.to_dict()), name)
    if key not in _CACHE:
        _CACHE[key] = api.quantize_onnx_model(str(model_dir / name), CALIB, platform=platform, setting=setting)
    return _CACHE[key]


def applied_activation_slots(graph):
    """(op, side, slot, variable, config) of every config the executor applies to an activation."""
    return [item for item in iter_configs(graph)
            if quantizes(item[4], item[1]) and not is_param_slot(graph, item[3])]


def assert_matches_simulation(graph, model, inputs=TEST, min_within=0.999):
    """The QDQ semantics (onnxruntime without graph optimizations: QuantizeLinear/DequantizeLinear and
    float ops as the ONNX spec defines them) must match the simulation to float noise: same top-1
    up to near ties, >= 99.9% of outputs within one output step.  With all optimizations onnxruntime
    fuses Q/DQ into integer kernels (integer accumulation, a float requantization multiplier): a
    different arithmetic, held to top-1 and cosine only."""
    result = verify_export(graph, inputs, model=model, optimizations=("disable", "all"))
    for name, stats in result["end_to_end"]["disable"].items():
        assert stats["top1_agreement_near_ties"] == 1.0, (name, stats)
        assert stats["within_one_step"] >= min_within, (name, stats)
        assert stats["max_steps"] <= 2.0 + 1e-4, (name, stats)
    for name, stats in result["end_to_end"]["all"].items():
        if fused_kernels_are_exact(model):  # else onnxruntime saturates on this CPU (see ppqlike.core.host)
            assert stats["top1_agreement"] >= 0.9 and stats["cosine"] >= 0.999, (name, stats)
    return result


@pytest.mark.parametrize("platform", ["TRT_INT8", "ORT_INT8", "DSP_INT8", "TIDL_INT8", "ACADEMIC_W4A8",
                                      "PPL_CUDA_INT8"])
def test_export_matches_simulation(model_dir, platform):
    graph = quantized(model_dir, platform)
    model, report = build_qdq_model(graph)
    onnx.checker.check_model(model)
    assert model.ir_version == 10 and report["opset"] == 13
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    assert report["rounding_mismatch"] is None
    result = assert_matches_simulation(graph, model)
    stats = result["end_to_end"]["disable"]["y"]
    if platform == "TRT_INT8":   # TensorRT's placement leaves the output float: only float noise differs
        assert stats["max_steps"] <= 1e-3 and stats["cosine"] >= 0.999999, result
    else:
        assert stats["exact"] >= 0.99, result  # a shallow graph: float noise flips almost nothing


@pytest.mark.parametrize("options", [dict(qdq_per_consumer=True), dict(uint8_activations=True),
                                     dict(qdq_per_consumer=True, uint8_activations=True)])
def test_export_options_give_the_same_values(model_dir, options):
    graph = quantized(model_dir, "TRT_INT8")
    plain, _ = build_qdq_model(graph)
    model, report = build_qdq_model(graph, **options)
    onnx.checker.check_model(model)
    reference = run_qdq_model(plain, {"x": TEST}, optimization="disable")[0]
    got = run_qdq_model(model, {"x": TEST}, optimization="disable")[0]
    np.testing.assert_array_equal(got, reference)  # same grid, same clamp: bit-identical
    assert_matches_simulation(graph, model)
    zero_points = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("zero_point")}
    quantize_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    if options.get("uint8_activations"):
        assert report["uint8_converted"] > 0
        assert all(zero_points[n.input[2]].dtype == np.uint8 for n in quantize_nodes)
        assert all(zero_points[n.input[2]] == 128 for n in quantize_nodes)
    if options.get("qdq_per_consumer"):  # every QuantizeLinear has exactly one consumer
        readers = {o.name: 1 for o in model.graph.output}
        for node in model.graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        assert all(readers.get(n.output[0], 0) == 1 for n in quantize_nodes)
        assert all(readers.get(n.output[0], 0) == 1 for n in model.graph.node if n.op_type == "DequantizeLinear"
                   and n.input[0] in {q.output[0] for q in quantize_nodes})


def _consumer_edges(graph, variable):
    return sum(1 for op in graph.operations.values() for v in op.inputs if v is variable)


@pytest.mark.parametrize("simplify", [True, False])
def test_exactly_the_simulated_quantization_points(model_dir, simplify):
    """One pair per applied activation config, none for OVERLAPPED ones; without the simplify pass a
    tensor is quantized twice (producer output, then the consumer's input) and exported so."""
    setting = QuantizationSettingFactory.for_platform("PPL_CUDA_INT8")   # signed int8, every output quantized
    setting.add_alignment, setting.float_outputs = "none", False
    setting.simplify = False if not simplify else setting.simplify
    graph = quantized(model_dir, "PPL_CUDA_INT8", setting=setting)
    slots = applied_activation_slots(graph)
    inputs_applied = [s for s in slots if s[1] == "input"]
    if simplify:  # the graph input, and the Concat input r1 (read elsewhere too: requantized on its edge)
        assert [(s[0].name, s[2], s[4].state) for s in inputs_applied] == [("conv1", 0, S.ACTIVATED),
                                                                          ("concat", 1, S.SLAVE)]
    else:
        assert len(inputs_applied) > 3  # double quantization in the simulation
    for per_consumer in (False, True):
        model, report = build_qdq_model(graph, qdq_per_consumer=per_consumer)
        expected = len(inputs_applied)
        for op, side, slot, variable, config in slots:
            if side == "output":
                edges = _consumer_edges(graph, variable)
                expected += edges if per_consumer and variable not in graph.outputs else 1
        assert report["activation_pairs"] == expected
        assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) == expected
        assert_matches_simulation(graph, model)


def test_layout_ops_keep_their_input_grid(model_dir):
    """Transpose/Flatten/MaxPool outputs are OVERLAPPED by their input grid: no pair after them,
    and the value they pass on carries the same scale and zero point as their input."""
    graph = quantized(model_dir, "ORT_INT8")
    model, report = build_qdq_model(graph)
    for name in ("pool", "transpose", "flatten"):
        operation = graph.operations[name]
        inp, out = operation.config.input_quantization_config[0], operation.config.output_quantization_config[0]
        assert out.state is S.OVERLAPPED and not is_applied(inp.state)
        assert np.array_equal(inp.scale, out.scale) and np.array_equal(inp.offset, out.offset)
        assert report["tensors"][operation.outputs[0].name] == operation.outputs[0].name  # no pair after it
    producers = {o: n for n in model.graph.node for o in n.output}
    feeding_pool = producers[[n for n in model.graph.node if n.name == "pool"][0].input[0]]
    assert feeding_pool.op_type == "DequantizeLinear"


def test_graph_output_keeps_its_name_and_the_batch_stays_dynamic(model_dir):
    graph = quantized(model_dir, "ORT_INT8")
    model, _ = build_qdq_model(graph)
    assert [o.name for o in model.graph.output] == ["y"]
    producer = [n for n in model.graph.node if "y" in n.output][0]
    assert producer.op_type == "DequantizeLinear"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    executor = NumpyExecutor(graph)
    for batch in (1, 5):
        got = run_qdq_model(model, {"x": TEST[:batch]})[0]
        assert got.shape == (batch, 10)
        step = output_steps(graph)["y"]
        assert compare_outputs(got, executor.forward(TEST[:batch])[0], step)["within_one_step"] == 1.0


def test_parameters(model_dir):
    """Weights: integer initializers → DequantizeLinear, per channel on axis 0 (Conv) / 0 (Gemm with
    transB); bias int32; Clip bounds float; a weight shared by two convs but a bias whose int32
    values differ get separate initializers; the simulated values come back bit for bit."""
    graph = quantized(model_dir, "ORT_INT8")
    model, report = build_qdq_model(graph)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    producers = {o: n for n in model.graph.node for o in n.output}
    for name in ("conv1", "conva", "convb", "convc", "gemm"):
        node, operation = nodes[name], graph.operations[name]
        weight_dq, bias_dq = producers[node.input[1]], producers[node.input[2]]
        assert weight_dq.op_type == bias_dq.op_type == "DequantizeLinear"
        assert inits[weight_dq.input[0]].dtype == np.int8 and inits[bias_dq.input[0]].dtype == np.int32
        assert helper.get_attribute_value(weight_dq.attribute[0]) == 0  # axis
        for slot in (1, 2):
            config = operation.config.input_quantization_config[slot]
            dq = producers[node.input[slot]]
            got = run_qdq_model(_single_dq_model(dq, inits), {}, optimization="disable")[0]
            np.testing.assert_array_equal(got, config.baked_value)
    assert producers[nodes["conva"].input[1]] is producers[nodes["convc"].input[1]]  # same weight config
    assert nodes["conva"].input[2] != nodes["convc"].input[2]  # bias scale S_in*S_w differs
    for name in ("clipa", "clipb"):
        operation = graph.operations[name]
        for slot in (1, 2):
            value = inits[nodes[name].input[slot]]
            assert value.dtype == np.float32 and value.shape == ()
            assert value == operation.config.input_quantization_config[slot].baked_value
    assert report["float_parameters"] >= 2


def _single_dq_model(node, inits):
    output = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    return make_model([node], [], [output], [numpy_helper.from_array(inits[n], n) for n in node.input])


def test_tpu_rounding_warns_and_is_reported(model_dir, tmp_path):
    graph = quantized(model_dir, "TPU_INT8")
    with pytest.warns(ExportRoundingWarning, match="half to even"):
        report = export_qdq_onnx(graph, tmp_path / "tpu.onnx")
    slots = applied_activation_slots(graph)
    assert report["rounding_mismatch"]["roundings"] == {"ROUND_HALF_AWAY_FROM_ZERO": len(slots)}
    requantized = [f"{op.name}/{side}/{slot}" for op, side, slot, _, c in slots if c.requantization is not None]
    assert report["rounding_mismatch"]["integer_requantization"] == requantized
    assert {"conv1/output/0", "gemm/output/0"} <= set(requantized)  # OVERLAPPED by relu1, and ACTIVATED
    model, _ = build_qdq_model(graph)
    assert [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c1"]
    model = onnx.load(str(tmp_path / "tpu.onnx"))
    assert {p.key: p.value for p in model.metadata_props}["ppqlike.matches_simulation"] == "no (rounding)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_qdq_onnx(quantized(model_dir, "TRT_INT8"), tmp_path / "trt.onnx")  # no warning


def test_sixteen_bit_activations_use_opset_21(model_dir):
    graph = api.quantize_onnx_model(str(model_dir / "small.onnx"), CALIB, platform="TRT_INT8")
    config = graph.operations["add"].config.output_quantization_config[0]
    config.num_of_bits = 16  # [-32768, 32767], same scale: a finer grid for one tensor
    model, report = build_qdq_model(graph)
    assert report["opset"] == 21
    zero_points = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name.startswith("s_zero_point")]
    assert zero_points and zero_points[0].dtype == np.int16
    assert any("QDQS8ToU8Transformer" in note for note in report["notes"])
    result = verify_export(graph, TEST, model=model, optimizations=("disable",))
    assert result["end_to_end"]["disable"]["y"]["within_one_step"] >= 0.999
    # onnxruntime 1.31 fails on int8 QDQ at opset 21 with its extended optimizations; uint8 works
    model, report = build_qdq_model(graph, uint8_activations=True)
    assert report["opset"] == 21 and not any("QDQS8ToU8Transformer" in note for note in report["notes"])
    assert_matches_simulation(graph, model)


def test_opset_11_model_is_upgraded(model_dir):
    graph = quantized(model_dir, "ORT_INT8", name="small11.onnx")
    assert graph.opset == 11
    model, report = build_qdq_model(graph)
    assert report["opset"] == 13
    onnx.checker.check_model(model)
    assert_matches_simulation(graph, model)


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_refuses_the_source_and_writes_atomically(model_dir, tmp_path, monkeypatch):
    graph = quantized(model_dir, "TRT_INT8")
    source = str(model_dir / "small.onnx")
    before = _digest(source)
    with pytest.raises(ExportError, match="input model"):
        export_qdq_onnx(graph, source)
    with pytest.raises(ExportError, match="input model"):
        api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx", config_save_to=source)
    assert _digest(source) == before
    assert os.listdir(tmp_path) == []  # refused before anything was written
    target = tmp_path / "out.onnx"
    target.write_bytes(b"old")

    def broken(*args, **kwargs):  # the final rename fails: the old file must survive whole
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", broken)
        with pytest.raises(ExportError, match="No space"):
            export_qdq_onnx(graph, target)
    assert target.read_bytes() == b"old"
    export_qdq_onnx(graph, target)
    onnx.checker.check_model(str(target))
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"]  # no temporary left behind
    assert _digest(source) == before


def test_unapplied_configs_are_exported_as_float(model_dir):
    """DEQUANTIZED configs (analysis) pass through in the simulation: nothing is written for them."""
    from ppqlike.executor.simulation import dequantized
    graph = quantized(model_dir, "ORT_INT8")
    with dequantized(graph):
        model, report = build_qdq_model(graph)
        assert report["activation_pairs"] == 0 and report["quantized_parameters"] == 0
        assert report["notes"]
        float_out = NumpyExecutor(graph).forward(TEST)[0]
    np.testing.assert_allclose(run_qdq_model(model, {"x": TEST})[0], float_out, rtol=1e-4, atol=1e-4)


def test_graph_input_read_by_two_ops_is_exported_as_simulated(tmp_path):
    """The second reader of a graph input is a SLAVE of the first reader's input config: both
    Convs read the input quantized on the same grid, in the simulation and in the export."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="c2"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 4])], weights)
    onnx.save(model, str(tmp_path / "two.onnx"))
    calibration = [rng.standard_normal((8, 3, 4, 4)).astype(np.float32)]
    graph = api.quantize_onnx_model(str(tmp_path / "two.onnx"), calibration, platform="TRT_INT8")
    first, second = (graph.operations[n].config.input_quantization_config[0] for n in ("c1", "c2"))
    assert first.state is S.ACTIVATED and second.state is S.SLAVE and second.master is first
    exported, _ = build_qdq_model(graph)
    assert sum(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in exported.graph.node) == 2
    inputs = rng.standard_normal((16, 3, 4, 4)).astype(np.float32)
    result = verify_export(graph, inputs, model=exported, optimizations=("disable",), per_operation_inputs=inputs)
    assert result["end_to_end"]["disable"]["y"]["within_one_step"] >= 0.999
    assert result["per_operation"]["min_exact"] == 1.0


def test_narrow_activation_range_is_clamped_exactly(model_dir):
    """A range narrower than its storage type ([-127, 127] in int8) gets a Clip after the
    DequantizeLinear at the grid's ends, so the export clamps where the simulation does."""
    graph = api.quantize_onnx_model(str(model_dir / "small.onnx"), CALIB, platform="PPL_CUDA_INT8")
    config = graph.operations["concat"].config.output_quantization_config[0]
    assert config.state is S.ACTIVATED  # master of the Conv output 'c' and of the Concat's input r1
    config.set_range(-127, 127)
    model, report = build_qdq_model(graph, uint8_activations=True)
    assert report["clips"] == 3  # the pairs of 'c', of r1 on the Concat edge, and of 'cat'
    clip = [n for n in model.graph.node if n.op_type == "Clip" and n.name.startswith("cat_")][0]
    low = numpy_helper.to_array([i for i in model.graph.initializer if i.name == clip.input[1]][0])
    assert low == np.float32(-127) * config.scale
    big = TEST * 50  # drive the Conv far below -127 steps so that the clamp matters
    simulated = NumpyExecutor(graph).forward(big, output_names=["cat"])[0]
    assert simulated.min() == low
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info(clip.output[0], TensorProto.FLOAT, None))
    exported = run_qdq_model(probe, {"x": big}, [clip.output[0]], optimization="disable")[0]
    assert np.mean(exported == simulated) >= 0.999


def test_ort_int8_writes_uint8_weights_with_the_same_values(model_dir, tmp_path):
    """ORT_INT8 stores int8 weights as uint8 + 128 (onnxruntime's u8 x u8 kernels are exact on every CPU);
    uint8_weights=False keeps int8.  Both dequantize to the same values, and the fused run of the uint8 one
    equals the simulation bit for bit."""
    graph = quantized(model_dir, "ORT_INT8")
    shifted = onnx.load(api.export_ppq_graph(graph, "ORT_INT8", tmp_path / "u8.onnx")[0])
    plain = onnx.load(api.export_ppq_graph(graph, "ORT_INT8", tmp_path / "s8.onnx", uint8_weights=False)[0])
    constants = {i.name: numpy_helper.to_array(i) for i in shifted.graph.initializer}
    weights = [n for n in shifted.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants
               and constants[n.input[0]].dtype != np.int32]
    assert weights and all(constants[n.input[0]].dtype == np.uint8 and np.all(constants[n.input[2]] == 128)
                           for n in weights)
    assert any(numpy_helper.to_array(i).dtype == np.int8 for i in plain.graph.initializer)
    np.testing.assert_array_equal(run_qdq_model(shifted, {"x": TEST}, optimization="disable")[0],
                                  run_qdq_model(plain, {"x": TEST}, optimization="disable")[0])
    np.testing.assert_array_equal(run_qdq_model(shifted, {"x": TEST}, optimization="all")[0],
                                  NumpyExecutor(graph).forward(TEST)[0])
