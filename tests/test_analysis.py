"""Error analysis (ppqlike.analysis): measures, graph-wise / layer-wise ranking, untouched states, stages.

The small model has one deliberately sensitive layer, ``conv2``: every output
channel's filter holds one huge weight (on an input channel that is always
zero, so it adds nothing in float) next to small ones; per-channel int8 then
spends its whole range on the huge weight and the small weights fall on a
grid far too coarse for them.  Its output is added, small, to a large
residual, so the error it makes is diluted downstream: both analyses must
rank it worst.
"""

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model
from ppqlike import api
from ppqlike.analysis import (ErrorStats, compare_stages, cosine_similarity, euclidean_similarity,
                              graphwise_error_analyse, layerwise_error_analyse, mse, quantizing_operations, snr,
                              sqnr)
from ppqlike.analysis.metrics import CHUNK, check_method
from ppqlike.core.quant import is_dequantizable
from ppqlike.executor import NumpyExecutor, OperationHook
from ppqlike.core.quant_graph import iter_tensor_configs
from ppqlike.executor.simulation import dequantized
from shared_bench import PRESETS, load_images, requires_bench

PLATFORM = "ORT_INT8"


def sensitive_model():
    """x[N,3,8,8] -> conv1 -> relu1 -> conv2 (sensitive) -> add(+relu1) -> conv3 -> relu3 -> gap -> flatten -> fc."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    w1[7], b1[7] = np.abs(w1[7]) * 0.02, -5.0      # channel 7 of relu1 is always 0 (|x| < 9 here)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.02).astype(np.float32)
    w2[:, 7, 1, 1] = 3.0                           # the huge weight, on the dead channel
    b2 = np.zeros(8, np.float32)
    w3 = (rng.standard_normal((8, 8, 1, 1)) * 0.4).astype(np.float32)
    b3 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    fc = (rng.standard_normal((10, 8)) * 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"), (w3, "w3"), (b3, "b3"), (fc, "fc_w"),
              (np.zeros(10, np.float32), "fc_b")]]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w3", "b3"], ["c3"], name="conv3"),
             helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             helper.make_node("GlobalAveragePool", ["r3"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)


def batches(count=2, size=8, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((size, 3, 8, 8)).astype(np.float32) for _ in range(count)]


@pytest.fixture(scope="module")
def quantized():
    setting = api.QuantizationSettingFactory.for_platform(PLATFORM)
    setting.float_outputs = False   # every layer analysed, the classifier writing the output too
    return api.quantize_onnx_model(sensitive_model(), batches(4), platform=PLATFORM, setting=setting)


def states(graph):
    """Every config's (op, side, slot, state, state to restore, masters), in a fixed order."""
    return [(op.name, side, slot, id(tqc), tqc.state, tqc.dequantized_from, tuple(id(m) for m in tqc.masters))
            for op, side, slot, _, tqc in iter_tensor_configs(graph)]


# ------------------------------------------------------------------------------------------ measures
def test_measures_agree_with_hand_computed_values():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 5.0])
    # signal 1+4+9+16 = 30, noise 1, a.b = 34, b.b = 39
    assert snr(a, b) == pytest.approx(10 * math.log10(30.0)) == pytest.approx(14.7712125)
    assert sqnr(a, b) == snr(a, b)
    assert cosine_similarity(a, b) == pytest.approx(34 / math.sqrt(30 * 39))
    assert mse(a, b) == pytest.approx(0.25)
    assert euclidean_similarity(a, b) == pytest.approx(1 - 1 / math.sqrt(((a + b) ** 2 / 4).sum()))
    assert snr(a, a) == math.inf and cosine_similarity(a, a) == pytest.approx(1.0) and mse(a, a) == 0.0
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert snr(a, np.zeros(4)) == pytest.approx(0.0)  # noise power = signal power
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0 and cosine_similarity(np.zeros(3), a[:3]) == 0.0
    assert check_method("SQNR") == "snr"
    with pytest.raises(ValueError, match="unknown error method"):
        check_method("psnr")
    with pytest.raises(ValueError, match="shapes"):
        snr(a, b[:3])


def test_streaming_sums_equal_the_concatenation():
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (10, CHUNK + 7, 3 * CHUNK)]
    noisy = [p + 0.05 * rng.standard_normal(p.size).astype(np.float32) for p in parts]
    stats = ErrorStats()
    for p, q in zip(parts, noisy):
        stats.update(p.reshape(-1, 1), q.reshape(-1, 1))
    a, b = np.concatenate(parts).astype(np.float64), np.concatenate(noisy).astype(np.float64)
    assert stats.count == a.size
    assert stats.snr() == pytest.approx(10 * math.log10((a * a).sum() / ((a - b) ** 2).sum()), rel=1e-6)
    assert stats.cosine() == pytest.approx((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-7)
    assert stats.mse() == pytest.approx(((a - b) ** 2).mean(), rel=1e-6)


# ------------------------------------------------------------------------------------------- ranking
def test_graphwise_ranks_the_sensitive_layer_worst(quantized, capsys):
    for method in ("snr", "cosine"):
        result = graphwise_error_analyse(quantized, batches(2, seed=1), method=method, verbose=True)
        assert list(result) == [op.name for op in quantizing_operations(quantized)]
        assert result.sorted_items()[0][0] == "conv2", result.table()
    out = capsys.readouterr().out
    assert "graphwise error analysis (cosine, worst first" in out
    assert out.splitlines()[2].startswith("conv2")  # the printed table starts with the worst op
    assert result.samples == 16 and result.batches == 2
    snrs = {n: s["snr"] for n, s in result.stats.items()}
    assert snrs["conv2"] < 15 and min(v for n, v in snrs.items() if n != "conv2") > snrs["conv2"] + 10


def test_layerwise_ranks_the_sensitive_layer_worst(quantized):
    for method in ("snr", "cosine", "mse"):
        result = layerwise_error_analyse(quantized, batches(1, seed=2), method=method, verbose=False)
        assert result.sorted_items()[0][0] == "conv2", result.table()
    assert result.samples == 8 and result.batches == 1  # one batch by default


def _hook_outputs(graph, inputs):
    class Capture(OperationHook):
        def __init__(self):
            self.outputs = {}

        def after_operation(self, operation, inputs, outputs):
            self.outputs[operation.name] = [np.array(o) for o in outputs]

    executor, float_hook, quant_hook = NumpyExecutor(graph), Capture(), Capture()
    with dequantized(graph):
        executor.forward(inputs, hooks=[float_hook])
    executor.forward(inputs, hooks=[quant_hook])
    return float_hook.outputs, quant_hook.outputs


def test_graphwise_equals_two_full_forwards_with_hooks(quantized):
    data = batches(1, seed=4)
    result = graphwise_error_analyse(quantized, data, verbose=False)
    fp, qt = _hook_outputs(quantized, data[0])
    for name, value in result.items():
        assert value == pytest.approx(snr(fp[name][0], qt[name][0]), rel=1e-6), name


def test_layerwise_equals_dequantizing_all_other_configs(quantized):
    data = batches(1, seed=5)
    result = layerwise_error_analyse(quantized, data, verbose=False)
    executor = NumpyExecutor(quantized)
    with dequantized(quantized):
        reference = executor.forward(data[0])[0]
    for name in ("conv2", "add", "fc"):
        own = {id(t) for op, *_, t in iter_tensor_configs(quantized) if op.name == name}
        switched = []
        try:
            for *_, tqc in iter_tensor_configs(quantized):
                if id(tqc) not in own and is_dequantizable(tqc.state):
                    tqc.set_dequantized()
                    switched.append(tqc)
            output = executor.forward(data[0])[0]
        finally:
            for tqc in switched:
                tqc.restore()
        assert result[name] == pytest.approx(snr(reference, output), rel=1e-6), name


def test_operations_subset_and_unknown_names(quantized):
    result = layerwise_error_analyse(quantized, batches(1), operations=["conv2", "flatten"], verbose=False)
    assert list(result) == ["conv2"]  # flatten quantizes nothing of its own
    with pytest.raises(KeyError, match="nope"):
        graphwise_error_analyse(quantized, batches(1), operations=["nope"], verbose=False)


# ------------------------------------------------------------------------------------------- states
def test_states_are_untouched_by_every_analysis(quantized, tmp_path):
    before = states(quantized)
    graphwise_error_analyse(quantized, batches(1), verbose=False)
    layerwise_error_analyse(quantized, batches(1), verbose=False)
    compare_stages(sensitive_model(), quantized, None, batches(1)[0])
    assert states(quantized) == before


def test_states_are_restored_when_an_analysis_is_interrupted(quantized, monkeypatch):
    before = states(quantized)

    def broken_loader():
        yield batches(1)[0]
        raise RuntimeError("disk on fire")

    for analyse in (graphwise_error_analyse, layerwise_error_analyse):
        with pytest.raises(RuntimeError, match="disk on fire"):
            analyse(quantized, broken_loader(), steps=2, verbose=False)
        assert states(quantized) == before
    # a kernel that fails in the middle of the graph, in the quantized stream
    executor = NumpyExecutor(quantized)
    original = executor.run_operation

    def failing(operation, inputs, quantized=True):
        if operation.name == "add" and quantized:
            raise ValueError("kernel exploded")
        return original(operation, inputs, quantized=quantized)

    monkeypatch.setattr(executor, "run_operation", failing)
    for analyse in (graphwise_error_analyse, layerwise_error_analyse):
        with pytest.raises(ppqlike.core.errors.ExecutionError, match="'add'.*kernel exploded"):
            analyse(quantized, batches(1), executor=executor, verbose=False)
        assert states(quantized) == before
    # compare_stages: a forward that raises inside the dequantized context is reported, states restored
    monkeypatch.setattr(executor, "forward", lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")))
    result = compare_stages(None, quantized, None, batches(1)[0], executor=executor)
    assert "boom" in result["skipped"]["ir_float"] and result["rows"] == []
    assert states(quantized) == before


# ------------------------------------------------------------------------------------------- stages
def test_compare_stages_on_the_small_model(quantized, tmp_path):
    path = api.export_ppq_graph(quantized, PLATFORM, tmp_path / "small.onnx")[0]
    result = compare_stages(sensitive_model(), quantized, path, batches(1, size=16, seed=9)[0])
    rows = {(r["reference"], r["measured"]): r for r in result["rows"]}
    assert list(rows) == [("fp32_onnx", "ir_float"), ("ir_float", "quantized"), ("quantized", "exported"),
                          ("fp32_onnx", "exported")]
    assert result["stages"] == ["fp32_onnx", "ir_float", "quantized", "exported"] and not result["skipped"]
    assert rows[("fp32_onnx", "ir_float")]["cosine"] >= 0.99999
    assert rows[("fp32_onnx", "ir_float")]["sqnr"] > 80
    assert rows[("quantized", "exported")]["cosine"] >= 0.99
    for row in rows.values():
        assert set(row) >= {"cosine", "euclidean", "sqnr", "max_abs_diff", "top1_agreement", "output"}
        assert -1 <= row["cosine"] <= 1 + 1e-9 and row["euclidean"] <= 1 + 1e-9
    # no exported model: that stage is skipped, the others compared
    result = compare_stages(sensitive_model(), quantized, None, {"x": batches(1)[0]})
    assert "exported" in result["skipped"] and len(result["rows"]) == 2


# --------------------------------------------------------------------------------------- real model
@requires_bench
@pytest.mark.real_model
def test_mobilenetv2_analyses(tmp_path):
    """All three analyses on MobileNetV2 with a few images (timings in the test output with -s)."""
    images, _, _ = load_images("mobilenetv2", "calib", 4)
    source = str(PRESETS["mobilenetv2"].path)
    graph = api.quantize_onnx_model(source, [images], platform="TRT_INT8")
    before = states(graph)
    executor = NumpyExecutor(graph)
    kept = {}
    graphwise = graphwise_error_analyse(graph, [images[:4]], executor=executor, verbose=False, keep_outputs=kept)
    ops = quantizing_operations(graph)
    assert len(graphwise) == len(ops)
    # TensorRT's placement quantizes what each Conv and Add reads: every Conv the protection left on int8
    protected = set(graph.metadata["quantization"]["protected_ops"])
    assert {op.name for op in graph.operations.values() if op.type == "Conv"} - protected < set(graphwise)
    assert len(protected) < 10
    assert all(math.isfinite(v) or v == math.inf for v in graphwise.values())
    layerwise = layerwise_error_analyse(graph, [images[:2]], executor=executor, verbose=False,
                                        operations=[ops[0].name, ops[len(ops) // 2].name, ops[-1].name])
    assert len(layerwise) == 3 and all(v > 0 for v in layerwise.values())
    exported = api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx")[0]
    stages = compare_stages(source, graph, exported, kept["inputs"], executor=executor,
                            precomputed={k: kept[k] for k in ("ir_float", "quantized")})
    rows = {(r["reference"], r["measured"]): r for r in stages["rows"]}
    assert rows[("fp32_onnx", "ir_float")]["cosine"] >= 0.99999
    assert rows[("ir_float", "quantized")]["cosine"] > 0.9
    assert rows[("fp32_onnx", "exported")]["cosine"] > 0.9
    assert states(graph) == before
    print(f"\nMobileNetV2: graphwise {graphwise.seconds:.1f} s on 4 images, layerwise {layerwise.seconds:.1f} s "
          f"for 3 ops on 2 images, stages {sum(stages['seconds'].values()):.1f} s")
