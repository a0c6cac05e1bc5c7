"""Transformer blocks (issue 14): LayerNorm/GELU recognised in the forms exporters write (every spelling:
tests/test_block_spellings.py), and each platform's transformer policy visible in the configs it writes; exports
still compute what the simulation computes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from shared_bench import BENCH_DIR, requires_bench
from transformer_models import encoder_inputs, encoder_model
from ppqlike import api
from ppqlike.core.errors import PlatformError
from ppqlike.core.patterns import find_transformer_blocks
from ppqlike.core.quant_graph import governing_config
from ppqlike.export.verify import verify_export
from ppqlike.io.load import load_graph
from ppqlike.optim.setting import QuantizationSettingFactory
from ppqlike.platforms.policies import PLATFORM_POLICIES
from ppqlike.platforms.quantizer import TransformerPolicy
from ppqlike.platforms.target import TargetPlatform

CALIB = [encoder_inputs(8, 1), encoder_inputs(8, 2)]
TEST = encoder_inputs(32, 3)


def test_bias_adds_and_weight_matmuls_are_not_blocks():
    graph = load_graph(encoder_model())
    kinds = {name: b.kind for b in find_transformer_blocks(graph) for name in b.operations}
    for operation in graph.operations.values():
        if operation.type in ("MatMul", "Add") and any(v.is_parameter for v in operation.inputs):
            assert kinds.get(operation.name) in (None, "LayerNorm", "Gelu"), operation


def test_unrelated_erf_sub_and_skip_add_are_left_alone():
    """An Erf without the GELU arithmetic around it, x - ReduceMean(x) without a variance, and an Add of two
    activations away from any LayerNorm (the skip connections of CNNs) are no blocks."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Erf", ["x"], ["e"], name="erf"),
             helper.make_node("ReduceMean", ["e"], ["m"], axes=[-1], name="mean"),
             helper.make_node("Sub", ["e", "m"], ["s"], name="sub"),
             helper.make_node("Add", ["s", "x"], ["y"], name="skip")]  # a CNN-style skip: no LayerNorm near
    graph_proto = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    graph = load_graph(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 13)]))
    assert find_transformer_blocks(graph) == []


def test_a_matmul_reading_probabilities_through_moves_is_a_probability_matmul():
    """Q K^T is an AttentionMatMul; the MatMul that reads the Softmax's probabilities through a Reshape and a
    Transpose (heads merged, as exporters write them) is a ProbabilityMatMul; a MatMul reading a Sigmoid's
    output (values in [0, 1] that are no probability row) stays an AttentionMatMul."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Transpose", ["x"], ["keys"], perm=[0, 2, 1], name="keys"),
             helper.make_node("MatMul", ["x", "keys"], ["scores"], name="scores"),
             helper.make_node("Softmax", ["scores"], ["probabilities"], axis=-1, name="softmax"),
             helper.make_node("Reshape", ["probabilities", "shape"], ["merged"], name="merge"),
             helper.make_node("Transpose", ["merged"], ["rows"], perm=[0, 2, 1], name="rows"),
             helper.make_node("MatMul", ["rows", "x"], ["weighted"], name="weighted"),
             helper.make_node("Sigmoid", ["scores"], ["gates"], name="sigmoid"),
             helper.make_node("MatMul", ["gates", "x"], ["gated"], name="gated")]
    graph_proto = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4, 8]) for name in ("weighted", "gated")],
        [numpy_helper.from_array(np.array([2, 4, 4], np.int64), "shape")])
    graph = load_graph(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 13)]))
    kinds = {block.tail: block.kind for block in find_transformer_blocks(graph)}
    assert kinds == {"scores": "AttentionMatMul", "softmax": "Softmax", "weighted": "ProbabilityMatMul",
                     "gated": "AttentionMatMul"}


def _quantized(platform: str, **setting_changes):
    """The encoder quantized for ``platform`` with every op's outputs quantized where the transformer policy says
    (the placement onnxruntime's integer kernels and TPU-MLIR's all-int8 lowering run; TensorRT keeps its own)."""
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.float_outputs = False   # (the policy's configs on every op, the last one too)
    if platform != "TRT_INT8":
        setting.placement = "every_output"
    for key, value in setting_changes.items():
        setattr(setting, key, value)
    return api.quantize_onnx_model(encoder_model(), CALIB, platform=platform, setting=setting)


def _on_grid(config, side: str) -> list[bool]:
    """Per slot: whether the value is on a quantization grid (its own config, or the one it overlaps)."""
    configs = config.input_quantization_config if side == "input" else config.output_quantization_config
    return [governing_config(c) is not None for c in configs]


@pytest.mark.parametrize("platform", ["TRT_INT8", "ORT_INT8", "TPU_INT8", "DSP_INT8", "ACADEMIC_INT8", "PPL_CUDA_INT8"])
def test_each_platform_policy_is_visible_in_its_configs(platform):
    graph = _quantized(platform)
    policy = PLATFORM_POLICIES[TargetPlatform.parse(platform)].transformer
    blocks = find_transformer_blocks(graph)
    for block in blocks:
        tail = graph.operations[block.tail]
        treatment = policy.treatment(block.kind)
        for name in block.operations[:-1]:
            assert graph.operations[name].config is None, (block.kind, name)  # computed inside, in float
        if treatment == "float":
            assert tail.config is None, (platform, block.kind)
        elif block.kind in ("AttentionMatMul", "ProbabilityMatMul"):
            assert all(_on_grid(tail.config, "input")), (platform, block.kind)
        elif len(block.operations) > 1:  # a decomposed block: float inside, quantized result
            assert not any(_on_grid(tail.config, "input")) and all(_on_grid(tail.config, "output")), block
        else:
            assert tail.config is not None, (platform, block.kind)
    summary = graph.metadata["quantization"]["dispatch"]["blocks"]
    assert set(summary) == {"LayerNorm", "Gelu", "Softmax", "AttentionMatMul", "ProbabilityMatMul", "ResidualAdd"}
    for kind, labels in summary.items():
        assert labels == {"TARGET" if policy.treatment(kind) == "quantize" else "FP32": Counter(
            b.kind for b in blocks)[kind]}


def test_platform_policies_follow_their_targets():
    """TensorRT and onnxruntime keep LayerNorm/GELU/Softmax in float; TPU-MLIR's int8 lowering makes GELU a
    lookup table (quantized in and out) and keeps LayerNorm (F16) and Softmax (F32) in float.  All three run the
    probabilities x V MatMul in float (NNCF's transformer mode leaves it unquantized too); the integer-only
    DSP quantizes it."""
    trt, ort, tpu = (PLATFORM_POLICIES[TargetPlatform.parse(name)].transformer
                     for name in ("TRT_INT8", "ORT_INT8", "TPU_INT8"))
    assert trt.as_dict() == {"LayerNorm": "float", "Gelu": "float", "Activation": "float", "Softmax": "float",
                             "AttentionMatMul": "quantize", "ProbabilityMatMul": "float", "ResidualAdd": "float",
                             "Embedding": "float"}
    assert ort.residual_add == "quantize" and ort.softmax == "float" and ort.layer_norm == "float"
    assert tpu.gelu == "quantize" and tpu.softmax == "float" and tpu.layer_norm == "float"
    assert ort.probability_matmul == tpu.probability_matmul == "float"
    assert PLATFORM_POLICIES[TargetPlatform.parse("DSP_INT8")].transformer.probability_matmul == "quantize"
    with pytest.raises(PlatformError, match="treatment"):
        TransformerPolicy(softmax="int4")


def test_dispatching_table_overrides_the_policy():
    graph = _quantized("TRT_INT8")
    residual = next(b for b in find_transformer_blocks(graph) if b.kind == "ResidualAdd")
    assert graph.operations[residual.tail].config is None
    pinned = _quantized("TRT_INT8", dispatching_table={residual.tail: "TARGET"})
    assert pinned.operations[residual.tail].config is not None
    assert pinned.metadata["quantization"]["dispatch"]["pinned"] == {residual.tail: "TARGET"}


@pytest.mark.parametrize("platform", ["TRT_INT8", "ORT_INT8", "TPU_INT8", "DSP_INT8", "PPL_CUDA_INT8"])
def test_transformer_exports_match_the_simulation(platform):
    graph = _quantized(platform)
    result = verify_export(graph, TEST, optimizations=("disable",))
    stats = result["end_to_end"]["disable"]["y"]
    assert stats["within_one_step"] >= 0.999 and stats["cosine"] >= 0.9999, stats


@requires_bench
def test_vit_quantizes_as_its_policy_says_and_exports_as_simulated():
    """The shared ViT for TensorRT on 8 calibration images: blocks labelled by the policy, SmoothQuant on its
    LayerNorms, the QDQ export computes the simulation, and the map stays close to FP32."""
    from onnx_helpers import run_onnxruntime as run
    from shared_bench import PRESETS, load_images
    from ppqlike.export import build_qdq_model
    from ppqlike.export.verify import run_qdq_model
    path = str(PRESETS["vit_s_focus"].path)
    calibration = load_images("vit_s_focus", "calib", 8)[0]
    graph = api.quantize_onnx_model(path, [calibration[:4], calibration[4:]], platform="TRT_INT8")
    meta = graph.metadata["quantization"]
    assert meta["dispatch"]["blocks"]["LayerNorm"] == {"FP32": 25}
    assert meta["dispatch"]["blocks"]["AttentionMatMul"] == {"TARGET": 12}
    assert meta["dispatch"]["blocks"]["ProbabilityMatMul"] == {"FP32": 12}
    smoothing = next(p["report"] for p in meta["passes"] if p["name"] == "smooth_quant")
    assert smoothing["smoothed"] >= 12  # the LayerNorms feeding the Q/K/V and fc1 MatMuls
    images = load_images("vit_s_focus", "dev", 2)[0]
    model, _ = build_qdq_model(graph)
    # op by op: each op of the export run by onnxruntime on the very values the simulation gives it (twelve
    # blocks deep, end-to-end float differences flip roundings and carry them forward: compared loosely)
    result = verify_export(graph, images, model=model, optimizations=("disable",), per_operation_inputs=images[:1])
    per_operation = result["per_operation"]
    assert per_operation["min_exact"] >= 0.99 and per_operation["max_steps"] <= 1 + 1e-4, per_operation
    assert per_operation["max_relative_error"] <= 1e-3, per_operation
    for stats in result["end_to_end"]["disable"].values():
        assert stats["cosine"] >= 0.999, stats
    import onnx
    reference = run(onnx.load(path), {"input_image": images})[0].reshape(2, -1)
    exported = run_qdq_model(model, {"input_image": images}, None, "all")[0].reshape(2, -1)
    cosine = (reference * exported).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(exported, axis=1)
    assert cosine.min() >= 0.97, cosine


@requires_bench
def test_vit_blocks_are_all_found():
    graph = load_graph(str(BENCH_DIR / "models" / "vit_s_focus.onnx"))
    blocks = find_transformer_blocks(graph)
    kinds = Counter(b.kind for b in blocks)
    # 12 blocks: 2 LayerNorms each and the final one, GELU and Softmax once, 2 attention MatMuls (Q K^T, and
    # the probabilities x V), 2 residual Adds (plus the position-embedding Add)
    assert kinds == {"LayerNorm": 25, "Gelu": 12, "Softmax": 12, "AttentionMatMul": 12, "ProbabilityMatMul": 12,
                     "ResidualAdd": 25}
    types = {b.kind: Counter() for b in blocks}
    for block in blocks:
        types[block.kind][(block.form, tuple(graph.operations[n].type for n in block.operations),
                           len(block.affine))] += 1
    # torch's LayerNorm before opset 17 and its exact GELU, every one whole (gamma and beta included)
    assert types["LayerNorm"] == {("layer_norm", ("ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div",
                                                  "Mul", "Add"), 2): 25}
    assert types["Gelu"] == {("erf", ("Div", "Erf", "Add", "Mul", "Mul"), 0): 12}


def test_tpu_gelu_is_an_int8_lookup_table():
    """TPU-MLIR lowers GELU in int8 to a 256-entry table from the int8 input to the int8 output: the simulated
    block (int8 source, float inside, int8 result) equals that table indexed by the input's integer."""
    from math import erf

    from ppqlike.executor import NumpyExecutor
    from ppqlike.executor.simulation import apply_output_config
    graph = _quantized("TPU_INT8")
    block = next(b for b in find_transformer_blocks(graph) if b.kind == "Gelu")
    source_config = governing_config(graph.variables[block.source].producer.config.output_quantization_config[0])
    tail_config = graph.operations[block.tail].config.output_quantization_config[0]
    assert source_config is not None and governing_config(tail_config) is not None
    source, result = NumpyExecutor(graph).forward({"x": TEST}, output_names=[block.source, block.result])
    scale = float(source_config.scale)
    integers = np.rint(source / scale).astype(np.int64)
    np.testing.assert_allclose(integers * scale, source, rtol=1e-6, atol=1e-6 * scale)  # the input is int8
    levels = np.arange(source_config.quant_min, source_config.quant_max + 1) * scale
    table = apply_output_config(tail_config, np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in levels],
                                                      np.float32))
    expected = table[integers - source_config.quant_min]
    step = float(tail_config.scale)
    assert np.mean(np.abs(expected - result) < 1e-6) >= 0.999  # float erf vs the graph's ops: rare boundary flips
    assert np.abs(expected - result).max() <= step * 1.0001


def test_ort_int8_transformer_runs_bit_for_bit_as_simulated():
    """onnxruntime with every optimization (its fused integer MatMul and Add kernels, attention included) gives
    exactly the simulated output of an encoder block (uint8 weights: exact on every CPU)."""
    graph = _quantized("ORT_INT8")
    result = verify_export(graph, TEST, optimizations=("all",), uint8_weights=True)
    assert result["end_to_end"]["all"]["y"]["exact"] == 1.0, result["end_to_end"]


@pytest.mark.parametrize("platform", ["ORT_INT8", "TPU_INT8", "TRT_INT8"])
def test_transformers_quantize_what_matmuls_read_by_default(platform, tmp_path):
    """By default a graph with LayerNorms quantizes only what its MatMuls read (onnxruntime runs them as
    MatMulIntegerToFloat, TPU-MLIR lists every other op F32): LayerNorm, GELU, Softmax and the residual Adds are
    float, their ops dispatched FP32, and so is the MatMul of the attention's probabilities and values; the export
    run by onnxruntime equals the simulation up to float rounding."""
    setting = QuantizationSettingFactory.for_platform(platform)
    graph = api.quantize_onnx_model(encoder_model(), CALIB, platform=platform, setting=setting)
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "placement")
    assert report["placement"] == "compute_inputs"
    for block in find_transformer_blocks(graph):
        if block.kind in ("LayerNorm", "Gelu", "Softmax", "ResidualAdd", "ProbabilityMatMul"):
            tail = graph.operations[block.tail]
            assert tail.platform is TargetPlatform.FP32 and (tail.config is None or not any(
                governing_config(c) for c in tail.config.output_quantization_config)), block
    probabilities = {b.tail for b in find_transformer_blocks(graph) if b.kind == "ProbabilityMatMul"}
    matmuls = [op for op in graph.operations.values() if op.type == "MatMul" and op.name not in probabilities]
    assert probabilities and matmuls and all(governing_config(op.config.input_quantization_config[0])
                                             for op in matmuls)
    result = verify_export(graph, TEST, optimizations=("all",))
    stats = result["end_to_end"]["all"]["y"]
    # TPU-MLIR rounds half away from zero, which QuantizeLinear does not: one step apart at ties (its report)
    assert stats["cosine"] >= 0.99999 and stats["max_steps"] <= (1.0 if platform == "TPU_INT8" else 0.01), stats
