"""report.html: self-contained, escaped, one bar per analysed op; written by ``ppqlike quantize``.

The visual check (a headless Chromium screenshot) runs where ``chromium`` is
installed and is skipped otherwise; see ppqlike/analysis/report.py for the
manual procedure.
"""

import copy
import json
import re
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import numpy as np
import pytest

from ppqlike import api
from ppqlike.analysis import (compare_stages, graphwise_error_analyse, layerwise_error_analyse,
                              quantizing_operations, quick_report, write_report)
from ppqlike.cli import load_demo_data, main
from test_analysis import PLATFORM, batches, sensitive_model

HOSTILE = '<script>alert("x")</script> & <img src=http://example.com/x.png>'


class Page(HTMLParser):
    """Collects tags with their attributes, and all text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)


def parse(path):
    page = Page()
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    page.feed(source)
    page.close()
    return page, source


def bars(page, svg_index=None):
    """The data-op of every bar, per chart (charts in document order)."""
    charts, current = [], None
    for tag, attrs in page.tags:
        if tag == "svg":
            current = []
            charts.append(current)
        elif tag == "rect" and attrs.get("class") == "bar":
            current.append(attrs["data-op"])
    return charts if svg_index is None else charts[svg_index]


def assert_self_contained(page, source, strict=True):
    """No tag that loads anything, no URL in any attribute or style; ``strict``: no 'http' anywhere at all."""
    if strict:
        assert "http" not in source.lower()
    assert "url(" not in source and "@import" not in source
    for tag, attrs in page.tags:
        assert not any("http" in str(v).lower() or "//" in str(v) for v in attrs.values()), (tag, attrs)
        assert tag not in ("script", "img", "link", "iframe", "object", "embed", "image", "use", "a"), tag
        assert not {"src", "href", "xlink:href", "srcset"} & set(attrs), (tag, attrs)
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)


@pytest.fixture(scope="module")
def analysed():
    graph = api.quantize_onnx_model(sensitive_model(), batches(2), platform=PLATFORM)
    graphwise = graphwise_error_analyse(graph, batches(1), verbose=False)
    layerwise = layerwise_error_analyse(graph, batches(1), verbose=False)
    stages = compare_stages(sensitive_model(), graph, None, batches(1)[0])
    return graph, graphwise, layerwise, stages


def test_report_structure_bars_and_escaping(analysed, tmp_path):
    graph, graphwise, layerwise, stages = analysed
    graph = copy.copy(graph)
    graph.metadata = copy.deepcopy(graph.metadata)
    meta = graph.metadata["quantization"]
    meta["passes"].insert(6, {"name": "bias_correction", "seconds": 0.5,
                              "report": {"corrected": 3, "ops": ["conv2", HOSTILE], "detail": {"note": HOSTILE}}})
    meta["setting"]["dispatching_table"] = {HOSTILE: "FP32"}
    path = write_report(tmp_path, graph, analysis=graphwise, stages=stages, layerwise=layerwise,
                        extra={"calibration": HOSTILE, "numbers": [1.5, float("inf")]})
    assert path == str(tmp_path / "report.html")
    page, source = parse(path)
    assert_self_contained(page, source, strict=False)  # HOSTILE holds 'http' as text
    text = " ".join(page.text)
    assert HOSTILE in text  # shown as text, not markup
    assert source.count("&lt;script&gt;") >= 4
    # one bar per op in each chart, in graph order: graph-wise then layer-wise
    charts = bars(page)
    assert charts == [list(graphwise), list(layerwise)]
    for heading in ("Settings", "Dispatch", "Per-layer error (graph-wise)", "Per-layer sensitivity (layer-wise)",
                    "Stage comparison", "What the passes did", "More"):
        assert heading in text, heading
    # balanced runs SmoothQuant (nothing to do on a CNN: no LayerNorm), then the inserted pass
    assert "Accuracy / user passes: smooth_quant, bias_correction" in text
    for name in ("fusion", "calibration", "baking", "corrected"):
        assert name in text
    assert "TARGET" in text and "fp32_onnx" in text and "ir_float" in text
    # the worst op comes first in the worst-ten table; the summary card names the worst one its consumers see
    from ppqlike.analysis.report import worst_visible
    assert graphwise.worst(1)[0][0] == "conv2"
    assert f"worst op as its consumers see it: {worst_visible(graphwise, graph)[0]}" in text


def test_report_without_analysis_and_with_plain_dict(analysed, tmp_path):
    graph, graphwise, _, _ = analysed
    page, source = parse(write_report(tmp_path / "a.html", graph))
    assert_self_contained(page, source)
    assert bars(page) == [] and "no analysis was run" in " ".join(page.text)
    plain = {name: value for name, value in graphwise.items()}  # a plain dict of SNR values works too
    page, source = parse(write_report(tmp_path / "b.html", graph, analysis=plain))
    assert bars(page) == [list(plain)]


def test_quick_report_and_a_failing_stage(analysed, tmp_path):
    graph, *_ = analysed
    result = quick_report(tmp_path / "r.html", graph, sensitive_model(), b"not a model", batches(2, size=4))
    assert result["worst"][0] == "conv2" and not result["errors"]
    page, source = parse(result["path"])
    assert_self_contained(page, source)
    text = " ".join(page.text)
    assert "stage exported skipped" in text and "fp32_onnx" in text
    assert bars(page) == [[op.name for op in quantizing_operations(graph)]]


def test_quantize_command_writes_the_report(tmp_path, capsys):
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "batch.npy", load_demo_data("calibration")[0][:40])
    model = tmp_path / "digits.onnx"
    shutil.copy(os.path.join(os.path.dirname(api.__file__), "data", "demo_model.onnx"), model)
    out = tmp_path / "out"
    code = main(["quantize", str(model), "--calib", str(calib), "--out", str(out), "--platform", "ort_int8",
                 "--batch-size", "16"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "report.html" in stdout and "ppqlike: report: worst op" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["files"]["report"] == str(out / "report.html") and "report" in summary["seconds"]
    page, source = parse(out / "report.html")
    assert_self_contained(page, source)
    text = " ".join(page.text)
    assert "ORT_INT8" in text and "quantized \u2192 exported" in text
    assert re.search(r"stage \S+ skipped", text) is None   # every comparison stage ran
    assert len(bars(page, 0)) > 3


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed "
                    "(apt-get install -y chromium); the structural checks above still ran")
def test_report_renders_in_headless_chromium(analysed, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    graph, graphwise, layerwise, stages = analysed
    path = write_report(tmp_path / "report.html", graph, analysis=graphwise, stages=stages, layerwise=layerwise)
    png = tmp_path / "report.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", f"--screenshot={png}",
                    "--window-size=1280,2000", f"file://{path}"], capture_output=True, timeout=90, check=False)
    assert png.is_file(), "chromium wrote no screenshot"
    image = np.asarray(Image.open(png).convert("RGB"))
    assert image.shape[:2] == (2000, 1280)
    # the bar colours of the SNR bands are on the page (the chart was drawn)
    colours = {tuple(c) for c in image.reshape(-1, 3)[::7]}
    assert len(colours) > 20
    assert any(abs(int(r) - 0xd9) < 8 and abs(int(g) - 0x53) < 8 and abs(int(b) - 0x4f) < 8
               for r, g, b in colours), "no red (< 10 dB) bar visible"


def test_report_points_where_a_fix_helps_and_says_how_it_measured(tmp_path):
    """A Conv fused into the Clip after it is judged by the Clip's output (what its consumers read); the
    agreement cards say how many samples; the settings show the values used; passes appear in the order
    they ran; the title is the model file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import ppqlike
    from ppqlike.analysis import render_report
    from ppqlike.analysis.report import worst_visible
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3, 1, 1)).astype(np.float32) * 4  # outputs far beyond the Clip's 0..1
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Clip", ["c", "low", "high"], ["y"], name="clip")]
    model = helper.make_model(helper.make_graph(
        nodes, "torch-jit-export", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 4])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.float32(0), "low"),
         numpy_helper.from_array(np.float32(1), "high")]), opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    path = tmp_path / "clipped_model.onnx"
    onnx.save(model, str(path))
    data = [rng.standard_normal((8, 3, 4, 4)).astype(np.float32)]
    # PPL CUDA: TensorRT's KL ranges, with every output quantized (TensorRT's placement leaves the last float)
    setting = ppqlike.QuantizationSettingFactory.for_platform("PPL_CUDA_INT8", recipe="plain")
    graph = ppqlike.quantize_onnx_model(str(path), data, platform="PPL_CUDA_INT8", setting=setting)
    analysis = graphwise_error_analyse(graph, data, verbose=False)
    assert analysis["conv"] < analysis["clip"]  # the Conv's own output carries the clipped-away range
    assert worst_visible(analysis, graph)[0] == "clip"
    exported = ppqlike.export_ppq_graph(graph, "PPL_CUDA_INT8", str(tmp_path / "q.onnx"))[0]
    stages = compare_stages(str(path), graph, exported, data[0])
    page = render_report(graph, analysis, stages)
    assert "worst op as its consumers see it: clip" in page
    cards = page[page.index('<div class="cards">'):][:1500]
    assert f"FP32 vs exported ({stages['samples']} samples)" in cards, cards
    assert "clipped_model.onnx" in page.split("</title>")[0] and "torch-jit-export" not in page.split("</h1>")[0]
    assert "(platform default)" in page and "activation_observer" in page
    observer = graph.metadata["quantization"]["effective_setting"]["activation_observer"]
    assert observer == "kl"  # the preset's, shown instead of None
    ran = [p["name"] for p in graph.metadata["quantization"]["passes"]]
    section = page[page.index("What the passes did"):]
    positions = [section.index(f"<tr><td><b>{name}</b>") for name in ran]
    assert positions == sorted(positions)
    assert ppqlike.analysis.write_report  # ppqlike.analysis is an attribute of the package
