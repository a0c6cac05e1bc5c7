"""Weight-only block quantization (W4A16 / W8A16): the block numerics against onnxruntime's blocked
DequantizeLinear and MatMulNBits (bit for bit), GPTQ and AWQ against nearest rounding, the two export formats
against the simulation, the setting, the command line and the shared ViT."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from ppqlike import QuantizationSetting
from ppqlike.core.errors import PlatformError, QuantizationStateError
from ppqlike.core.quant_block import (BlockQuantizationConfig, block_parameters, block_range, dequantize_blocks,
                                      quantize_blocks)
from ppqlike.executor.simulation import dequantized
from ppqlike.export.qdq_blocks import _code_tensor, _pack, _pack_zero_points
from ppqlike.optim.passes.gptq import gptq_quantize
from ppqlike.optim.passes.weight_only import rtn_codes

from shared_bench import BENCH_DIR, HAVE_BENCH, load_images


def _session(model: onnx.ModelProto, accuracy_level: str = "0") -> ort.InferenceSession:
    """A CPU session; onnxruntime fuses blocked DequantizeLinear -> MatMul into MatMulNBits with this
    accuracy level (its default, 4, quantizes the activations to int8: not W4A16)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", accuracy_level)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _random_weight(rng, rows, columns):
    weight = rng.standard_normal((rows, columns)).astype(np.float32) * 0.05
    weight[rng.random((rows, columns)) < 0.01] *= 20   # a few outliers, as real weights have
    return weight


# ------------------------------------------------------------------------------------ numerics
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 80), columns=st.integers(1, 6), block=st.sampled_from([16, 32, 64]),
       bits=st.sampled_from([4, 8]), symmetric=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_block_rounding_error_within_a_step(rows, columns, block, bits, symmetric, seed):
    """Nearest rounding: every value within half a step of its block's grid, except the symmetric range's
    narrow end, clamped by less than one step; the codes stay in range."""
    weight = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    scale, zero = block_parameters(weight, 0, block, bits, symmetric)
    assert scale.shape == (-(-rows // block), columns)
    codes = quantize_blocks(weight, scale, zero, 0, block, bits, symmetric)
    low, high = block_range(bits, symmetric)
    assert codes.min() >= low and codes.max() <= high
    step = np.abs(np.repeat(scale, block, axis=0)[:rows]).astype(np.float64)
    error = np.abs(dequantize_blocks(codes, scale, zero, 0, block).astype(np.float64) - weight)
    bound = (1.0 if symmetric else 0.5) * step * (1 + 1e-5) + 1e-12
    assert np.all(error <= bound)
    if symmetric:   # each block's largest magnitude is exact
        for b in range(scale.shape[0]):
            part = weight[b * block:(b + 1) * block]
            peak = np.abs(part).max(axis=0)
            recovered = np.abs(dequantize_blocks(codes, scale, zero, 0, block)[b * block:(b + 1) * block]).max(0)
            np.testing.assert_allclose(recovered, peak, rtol=1e-6)


@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
@pytest.mark.parametrize("axis", [0, 1])
def test_block_dequantize_equals_onnxruntime_dequantize_linear(bits, symmetric, axis):
    """The simulation's dequantized weight is bit for bit onnxruntime's opset-21 blocked DequantizeLinear
    (int4/uint4/int8/uint8, a last partial block, either axis)."""
    rng = np.random.default_rng(bits + 2 * axis)
    weight = _random_weight(rng, 80, 24) if axis == 0 else _random_weight(rng, 24, 80)
    scale, zero = block_parameters(weight, axis, 32, bits, symmetric)
    codes = quantize_blocks(weight, scale, zero, axis, 32, bits, symmetric)
    config = BlockQuantizationConfig("w", bits, symmetric, axis, 32, scale, zero, codes)
    initializers = [_code_tensor("q", codes, bits, symmetric), numpy_helper.from_array(scale, "s")]
    inputs = ["q", "s"]
    if not symmetric:
        initializers.append(_code_tensor("z", zero, bits, False))
        inputs.append("z")
    node = helper.make_node("DequantizeLinear", inputs, ["w"], axis=axis, block_size=32)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    result, = _session(model).run(None, {})
    assert np.array_equal(result, config.baked_value)
    assert np.array_equal(config.baked_value, dequantize_blocks(codes, scale, zero, axis, 32))


@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
def test_block_dequantize_equals_onnxruntime_matmul_nbits(bits, symmetric):
    """MatMulNBits times the identity gives its dequantized weight exactly (adding zeros is exact): bit for bit
    the simulation's, K = 80 with a last partial block, odd block count (zero points packed two per byte)."""
    rng = np.random.default_rng(bits)
    rows, columns, block = 80, 24, 16 if bits == 4 else 32
    weight = _random_weight(rng, rows, columns)
    scale, zero = block_parameters(weight, 0, block, bits, symmetric)
    codes = quantize_blocks(weight, scale, zero, 0, block, bits, symmetric)
    shift = 0 if not symmetric else 1 << (bits - 1)
    initializers = [numpy_helper.from_array(_pack((codes + shift).T, bits, block), "B"),
                    numpy_helper.from_array(np.ascontiguousarray(scale.T).reshape(-1), "S")]
    inputs = ["x", "B", "S"]
    if not symmetric:
        initializers.append(numpy_helper.from_array(_pack_zero_points(zero.T, bits), "Z"))
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=rows, N=columns, bits=bits,
                            block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    result, = _session(model).run(None, {"x": np.eye(rows, dtype=np.float32)})
    assert np.array_equal(result, dequantize_blocks(codes, scale, zero, 0, block))


def test_block_config_checks_its_arrays():
    weight = np.ones((64, 4), np.float32)
    scale, zero = block_parameters(weight, 0, 32, 4, False)
    codes = quantize_blocks(weight, scale, zero, 0, 32, 4, False)
    with pytest.raises(QuantizationStateError, match="block scales"):
        BlockQuantizationConfig("w", 4, False, 0, 32, scale[:1], zero[:1], codes)
    with pytest.raises(QuantizationStateError, match="codes outside"):
        BlockQuantizationConfig("w", 4, False, 0, 32, scale, zero, codes + 16)
    config = BlockQuantizationConfig("w", 4, False, 0, 32, scale, zero, codes)
    assert np.array_equal(config.fake_quantize(weight), config.baked_value)
    with pytest.raises(QuantizationStateError, match="no per-tensor"):
        config.fake_quantizer()


# ------------------------------------------------------------------------------------ GPTQ
def test_gptq_with_uncorrelated_inputs_is_nearest_rounding():
    """With H = identity there is no error to push onto other rows: GPTQ's codes are RTN's exactly."""
    weight = _random_weight(np.random.default_rng(1), 96, 40)
    for symmetric in (True, False):
        gptq = gptq_quantize(weight, np.eye(96), 32, 4, symmetric)
        rtn = rtn_codes(weight, 32, 4, symmetric)
        for mine, theirs in zip(gptq, rtn):
            assert np.array_equal(mine, theirs)


def test_gptq_lowers_the_output_error_on_correlated_inputs():
    """On correlated inputs (many more rows than K) GPTQ's output error ||X W - X Q||^2 is well below RTN's
    on held-out rows of the same distribution."""
    rng = np.random.default_rng(2)
    mixing = rng.standard_normal((64, 64)) / 8 + np.eye(64)
    calibration, held = (rng.standard_normal((n, 64)) @ mixing for n in (2048, 512))
    weight = _random_weight(rng, 64, 48)
    errors = {}
    for name, (scale, zero, codes) in {"gptq": gptq_quantize(weight, calibration.T @ calibration, 32, 4, True),
                                       "rtn": rtn_codes(weight, 32, 4, True)}.items():
        quantized = dequantize_blocks(codes, scale, zero, 0, 32)
        errors[name] = float(np.sum((held @ (weight - quantized)) ** 2))
    assert errors["gptq"] < 0.8 * errors["rtn"]


# ------------------------------------------------------------------------------------ models
def _layer_norm_model(path, rng):
    """x -> LayerNormalization -> MatMul (q), MatMul (k) -> Add -> Gelu-free Relu -> Gemm(transB, bias)."""
    k, hidden, n = 64, 96, 24
    gamma = (1 + rng.standard_normal(k) * 0.3).astype(np.float32)
    gamma[:4] *= 8   # outlier channels, as transformers have
    beta = (rng.standard_normal(k) * 0.1).astype(np.float32)
    weights = {"wq": _random_weight(rng, k, hidden), "wk": _random_weight(rng, k, hidden),
               "w2": _random_weight(rng, n, hidden), "b2": rng.standard_normal(n).astype(np.float32),
               "gamma": gamma, "beta": beta}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "wq"], ["q"]), helper.make_node("MatMul", ["ln", "wk"], ["kk"]),
             helper.make_node("Add", ["q", "kk"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "ln_model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n])],
                              [numpy_helper.from_array(v, name) for name, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = _layer_norm_model(str(tmp_path_factory.mktemp("wo") / "small.onnx"), rng)
    batches = [(rng.standard_normal((32, 64)) * (1 + np.arange(64) % 5)).astype(np.float32) for _ in range(6)]
    return path, batches


def _quantize(path, batches, **options):
    setting = QuantizationSetting(weight_only_bits=options.pop("bits", 4), **options)
    return ppqlike.quantize_onnx_model(path, batches, platform="ORT_INT8", setting=setting)


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_both_formats_run_in_onnxruntime_as_simulated(small_model, tmp_path, method, symmetric, bits):
    """Each weight's dequantized value in the exported model is the simulation's bit for bit (checked on the
    ONNX initializers through onnxruntime's own DequantizeLinear above); the outputs agree within float32
    rounding of the MatMul (onnxruntime's GEMM sums in another order than numpy's): |diff| <= 1e-5 x the
    output scale.  Only MatMul/Gemm weights are quantized; the MatMulNBits file has no DequantizeLinear."""
    path, batches = small_model
    graph = _quantize(path, batches, weight_only_method=method, weight_only_symmetric=symmetric, bits=bits)
    configs = [op.config for op in graph.operations.values() if op.config is not None]
    assert len(configs) == 3 and all(c.input_quantization_config[1].method == method for c in configs)
    assert all(c.input_quantization_config[0] is None for c in configs)
    simulated, = ppqlike.NumpyExecutor(graph).forward({"x": batches[-1]})
    with dequantized(graph):
        float_output, = ppqlike.NumpyExecutor(graph).forward({"x": batches[-1]})
    reference, = _session(onnx.load(path)).run(None, {"x": batches[-1]})
    np.testing.assert_allclose(float_output, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    for fmt in ("qdq", "matmulnbits"):
        out = tmp_path / f"{fmt}.onnx"
        ppqlike.export_ppq_graph(graph, "ORT_INT8", str(out), weight_only_format=fmt)
        model = onnx.load(str(out))
        types = [node.op_type for node in model.graph.node]
        if fmt == "matmulnbits":
            assert types.count("MatMulNBits") == 3 and "DequantizeLinear" not in types
        else:
            assert types.count("DequantizeLinear") == 3 and model.opset_import[0].version == 21
        exported, = _session(model).run(None, {"x": batches[-1]})
        assert np.abs(exported - simulated).max() <= 1e-5 * np.abs(simulated).max()
        if fmt == "qdq" and bits == 4 and method == "rtn":   # onnxruntime's default fusion quantizes the activations (W4A8)
            fused, = _session(model, accuracy_level="4").run(None, {"x": batches[-1]})
            assert np.abs(fused - simulated).max() > 1e-4 * np.abs(simulated).max()
    cosine = float(np.sum(simulated * reference) / np.linalg.norm(simulated) / np.linalg.norm(reference))
    assert cosine > (0.99 if bits == 4 else 0.9999)


def test_awq_keeps_the_float_function_and_beats_nearest_rounding(small_model):
    """AWQ's scaling moves into gamma/beta and a Mul (the FP32 outputs unchanged up to float rounding) and its
    output error on the calibration data is below RTN's."""
    path, batches = small_model
    reference, = _session(onnx.load(path)).run(None, {"x": batches[0]})
    errors = {}
    for method in ("rtn", "awq"):
        graph = _quantize(path, batches, weight_only_method=method)
        output, = ppqlike.NumpyExecutor(graph).forward({"x": batches[0]})
        errors[method] = float(np.sum((output - reference) ** 2))
        if method == "awq":
            report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "awq")
            assert any(group["alpha"] > 0 and group["into"] == "gamma/beta" for group in report["scaled_groups"])
    assert errors["awq"] < errors["rtn"]


def test_weight_only_other_platforms_export(small_model, tmp_path):
    """Weight-only works on any platform: TensorRT's dynamic ranges hold no INT8 amax for block weights, the
    config JSON says it cannot be reloaded (the codes are in the model), onnxruntime runs the model."""
    from ppqlike.core.errors import ExportError
    from ppqlike.export import load_quantized_graph
    path, batches = small_model
    graph = ppqlike.quantize_onnx_model(path, batches, platform="TRT_INT8",
                                        setting=QuantizationSetting(weight_only_bits=4))
    files = ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"), str(tmp_path / "m.json"))
    ranges = json.loads(open(files[1]).read())
    assert ranges["weight_quant_info"] == {} and ranges["act_quant_info"] == {}
    _session(onnx.load(files[0])).run(None, {"x": batches[0]})
    with pytest.raises(ExportError, match="weight-only block config"):
        load_quantized_graph(path, str(tmp_path / "m.json"))


def test_weight_only_setting_is_checked_and_saved(tmp_path):
    for bad, fragment in ((dict(weight_only_bits=3), "weight_only_bits"),
                          (dict(weight_only_block_size=24), "power of 2"),
                          (dict(weight_only_method="hqq"), "weight_only_method"),
                          (dict(weight_only_format="gguf"), "weight_only_format")):
        with pytest.raises(PlatformError, match=fragment):
            QuantizationSetting(**bad)
    setting = QuantizationSetting(weight_only_bits=4, weight_only_method="gptq", weight_only_block_size=128)
    setting.save(tmp_path / "s.json")
    assert QuantizationSetting.load(tmp_path / "s.json") == setting


def test_cli_weight_only(tmp_path, small_model, capsys):
    from ppqlike.cli.main import main
    path, batches = small_model
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, batch in enumerate(batches):
        np.save(calib / f"{index}.npy", batch)
    out = tmp_path / "out"
    code = main(["quantize", path, "--calib", str(calib), "--out", str(out), "--platform", "ort_int8",
                 "--weight-only", "4", "--block-size", "32", "--weight-only-method", "gptq",
                 "--weight-only-format", "matmulnbits", "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    model = onnx.load(summary["files"]["model"])
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 3
    setting = summary.get("effective_setting") or {}
    assert not setting or setting.get("weight_only_method") == "gptq"


@pytest.mark.skipif(not HAVE_BENCH, reason="the shared benchmark folder ../shared/bench is absent")
def test_shared_vit_w4a16_rtn(tmp_path):
    """The shared ViT-S at W4 block 32 (RTN): the exported MatMulNBits model computes the simulation
    (float32 rounding) and stays close to FP32 (bench/weight_only.py measures GPTQ/AWQ: docs/BENCHMARKS.md)."""
    images = load_images("vit_s_focus", "calib", 10)[0]
    path = str(BENCH_DIR / "models" / "vit_s_focus.onnx")
    graph = _quantize(path, [images[:4], images[4:8]])
    simulated, = ppqlike.NumpyExecutor(graph).forward({"input_image": images[8:]})
    out = tmp_path / "vit.onnx"
    ppqlike.export_ppq_graph(graph, "ORT_INT8", str(out), weight_only_format="matmulnbits")
    exported, = _session(onnx.load(str(out))).run(None, {"input_image": images[8:]})
    reference, = _session(onnx.load(path)).run(None, {"input_image": images[8:]})
    assert np.abs(exported - simulated).max() < 1e-4
    for image in range(2):
        a, b = exported[image].ravel(), reference[image].ravel()
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99
    import os
    assert os.path.getsize(out) < 0.3 * os.path.getsize(path)
