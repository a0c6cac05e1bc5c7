"""The benchmark's peer rows (bench/peers.py, bench/recipe_report.py, bench/peers_report.py) without the peers'
venv: what a QDQ model quantizes, the rows' fallback when the venv is absent, and the class comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import peers_report  # noqa: E402
import recipe_report  # noqa: E402
import report  # noqa: E402


def _constant(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _qdq_model(path: Path, activation_zero, output_qdq: bool) -> Path:
    """input -> Q/DQ (activation_zero's type and value) -> Identity -> Conv (int8 per-channel weight DQ) ->
    Relu -> [Q/DQ] -> MatMul with a float weight -> output."""
    weight = np.arange(2 * 3, dtype=np.int8).reshape(2, 3, 1, 1)
    initializers = [
        _constant("a_scale", np.float32(0.1)), _constant("a_zero", activation_zero),
        _constant("w_q", weight), _constant("w_scale", np.array([0.5, 0.25], np.float32)),
        _constant("w_zero", np.zeros(2, np.int8)), _constant("o_scale", np.float32(0.2)),
        _constant("o_zero", np.int8(0)), _constant("m_w", np.ones((4, 5), np.float32)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "a_scale", "a_zero"], ["input_q"]),
        helper.make_node("DequantizeLinear", ["input_q", "a_scale", "a_zero"], ["input_dq"]),
        helper.make_node("Identity", ["input_dq"], ["input_id"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=0),
        helper.make_node("Conv", ["input_id", "w"], ["conv"], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"]),
    ]
    last = "relu"
    if output_qdq:
        nodes += [helper.make_node("QuantizeLinear", ["relu", "o_scale", "o_zero"], ["relu_q"]),
                  helper.make_node("DequantizeLinear", ["relu_q", "o_scale", "o_zero"], ["relu_dq"])]
        last = "relu_dq"
    nodes.append(helper.make_node("MatMul", [last, "m_w"], ["output"], name="head"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 2, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 2, 5])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_qdq_summary_reads_activations_weights_and_float_ops(tmp_path):
    summary = peers.qdq_summary(_qdq_model(tmp_path / "m.onnx", np.uint8(0), output_qdq=False))
    assert summary["activation_quantizers"] == {"uint8 zero 0": 1}
    assert summary["activation"] == "uint8 [0, max] (zero point 0)"
    assert summary["weight_quantizers"] == {"int8 per-channel": 1}
    # the Conv reads the DequantizeLinear through the Identity; the MatMul reads an unquantized input and weight
    assert summary["compute_ops"] == 2 and summary["float_compute_ops"] == ["head"]
    assert summary["output_quantized"] is False and summary["float16"] is False


def test_qdq_summary_names_mixed_kinds(tmp_path):
    summary = peers.qdq_summary(_qdq_model(tmp_path / "m.onnx", np.uint8(128), output_qdq=True))
    assert summary["activation_quantizers"] == {"uint8 zero 128": 1, "int8 zero 0": 1}
    assert summary["activation"] == "mixed: 1 symmetric uint8, 1 symmetric int8"
    assert summary["float_compute_ops"] == ["head"]   # its weight is still float


def test_rows_are_unavailable_without_the_venv(monkeypatch, tmp_path):
    monkeypatch.setenv("PPQLIKE_PEERS_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    peers.unavailable.cache_clear()
    try:
        reason = peers.unavailable("nncf")
        assert reason is not None and "missing" in reason and "peers_venv.sh" in reason
        assert "unavailable" in peers.versions_note(["nncf"])
    finally:
        peers.unavailable.cache_clear()


def _row(agreement: float, cosine: float) -> dict:
    return {"accuracy": {"agreement": agreement, "cosine": cosine, "snr_db": 20.0, "top1": 0.8},
            "quantization": {"wall_seconds": 1.0, "peak_rss_mb": 100.0, "cpu_seconds": 1.0}}


def test_recipe_rows_meet_the_best_peer_of_their_class():
    rows = {"ppqlike:ORT_INT8:default": _row(0.95, 0.99), "ppqlike:TRT_INT8:default": _row(0.93, 0.98),
            "nncf:default": _row(0.97, 0.995),       # symmetric class: the best of it
            "modelopt:max": _row(0.96, 0.999),
            "nncf:mixed": _row(0.94, 0.99), "quark:u8s8_pc": _row(0.96, 0.991),
            "ort:MinMax:per_channel": _row(0.96, 0.992),
            "quark:a8w8_pc": {"unavailable": "no venv"}}
    model = {"model": "m", "title": "M", "rows": rows}
    assert recipe_report.best_peer(model, "symmetric")[0] == "nncf:default"
    assert recipe_report.best_peer(model, "asymmetric")[0] == "ort:MinMax:per_channel"   # tie on agreement: cosine
    lines = recipe_report.peer_comparison([model])
    orts = [line for line in lines if line.startswith("| ORT_INT8 balanced")]
    trts = [line for line in lines if line.startswith("| TRT_INT8 balanced")]
    assert len(orts) == 1 and "onnxruntime MinMax per-channel (-0.010)" in orts[0]
    assert len(trts) == 1 and "NNCF default" in trts[0] and "(-0.040)" in trts[0]
    assert recipe_report._cell(model, "quark:a8w8_pc") == "unavailable"


def test_the_peers_section_replaces_its_older_self(tmp_path):
    path = tmp_path / "B.md"
    path.write_text("# generated\n\n" + report.KEPT_MARKER + "\n\n## Other (issue 1)\n\ntext\n")
    peers_report.write_section(peers_report.TITLE + "\n\nfirst\n", path)
    peers_report.write_section(peers_report.TITLE + "\n\nsecond\n", path)
    text = path.read_text()
    assert text.count(peers_report.TITLE) == 1 and "second" in text and "first" not in text
    assert text.index(peers_report.TITLE) < text.index("## Other (issue 1)") and text.startswith("# generated")


def test_qdq_summary_names_per_channel_activations(tmp_path):
    """NNCF quantizes a depthwise Conv's input per channel: the activation quantizer's scale is a vector."""
    scale, zero = np.array([0.1, 0.2, 0.3], np.float32), np.zeros(3, np.uint8)
    nodes = [helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["output"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 2])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 2])],
                              [_constant("s", scale), _constant("z", zero)])
    path = tmp_path / "pc.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    summary = peers.qdq_summary(path)
    assert summary["activation_quantizers"] == {"uint8 zero 0 per-channel": 1}
    assert summary["activation"] == "uint8 [0, max] (zero point 0) per-channel"
    assert summary["compute_ops"] == 0 and summary["output_quantized"] is True


def test_logits_before_a_final_softmax_count_as_the_output(tmp_path):
    nodes = [helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["output"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])],
                              [_constant("s", np.float32(0.1)), _constant("z", np.int8(0))])
    path = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    assert peers.qdq_summary(path)["output_quantized"] is True
