"""The ``ppqlike`` command line end to end: demo, quantize (arrays, images, a shared model) and bad input.

Every bad input exits with status 2 and one line ``ppqlike: error: ...`` on
stderr (no traceback); the input model is never modified and, when a run
fails, nothing is written.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from ppqlike.cli import export as cli_export
from ppqlike.cli.main import _data_path, load_demo_data, main
from ppqlike.core.errors import ExportError
from shared_bench import BENCH_DIR, load_images, requires_bench

DEMO = _data_path("demo_model.onnx")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(path):
    with open(path, "rb") as handle:
        return handle.read(), os.stat(path).st_mtime_ns


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def npy_calib(tmp_path_factory):
    """The demo's calibration split as .npy files: one batch file and three single samples."""
    folder = tmp_path_factory.mktemp("npy_calib")
    images = load_demo_data("calibration")[0]
    np.save(folder / "batch.npy", images[:61])
    for index in range(3):
        np.save(folder / f"sample{index}.npy", images[61 + index])
    return folder


@pytest.fixture(scope="module")
def demo_copy(tmp_path_factory):
    """A copy of the demo model in a folder of its own (tests that write beside the model use it)."""
    folder = tmp_path_factory.mktemp("model")
    shutil.copy(DEMO, folder / "digits.onnx")
    return folder / "digits.onnx"


# ---------------------------------------------------------------------------------------------- demo
def test_demo_end_to_end(tmp_path, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("system_temporary")))
    before = _state(DEMO)
    started = time.perf_counter()
    code, out, err = _run(capsys, "demo", "--quiet")  # default output folder: a new temporary one
    seconds = time.perf_counter() - started
    assert code == 0, err
    assert seconds < 15
    assert _state(DEMO) == before
    fp32 = re.search(r"FP32 accuracy\s+executor ([\d.]+)\s+onnxruntime ([\d.]+)", out)
    int8 = re.search(r"INT8 \(ORT_INT8\) accuracy\s+simulated ([\d.]+)\s+exported in onnxruntime ([\d.]+)", out)
    agreement = re.search(r"simulated vs exported\s+top-1 agreement ([\d.]+)", out)
    assert fp32 and int8 and agreement, out
    assert float(fp32.group(1)) == float(fp32.group(2)) > 0.95
    assert float(int8.group(1)) > 0.95 and abs(float(int8.group(1)) - float(int8.group(2))) <= 0.002
    assert float(agreement.group(1)) >= 0.998
    assert os.listdir(tmp_path) == []  # nothing in the current folder
    folder = Path(re.search(r"wrote into (\S+):", out).group(1))
    assert folder.name.startswith("ppqlike-demo-out-")
    assert sorted(os.listdir(folder)) == ["demo_model.ort_int8.json", "demo_model.ort_int8.onnx", "summary.json"]
    assert str(folder / "demo_model.ort_int8.onnx") in out
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["platform"] == "ORT_INT8" and summary["ops"] == {"TARGET": 10, "FP32": 1, "SOI": 0}
    assert summary["peak_memory_mib"] > 0 and summary["seconds"]["total"] > 0
    json.loads((folder / "demo_model.ort_int8.json").read_text())
    images, labels = load_demo_data("test")
    logits = _session(folder / "demo_model.ort_int8.onnx").run(None, {"image": images})[0]
    assert np.mean(logits.argmax(1) == labels) > 0.95


def test_demo_other_platform_and_out(tmp_path, capsys):
    code, out, err = _run(capsys, "demo", "--quiet", "--platform", "academic_int8", "--out", tmp_path / "d")
    assert code == 0, err
    assert (tmp_path / "d" / "demo_model.academic_int8.onnx").is_file()


# ------------------------------------------------------------------------------------------ quantize
def test_quantize_npy_folder_with_table_and_setting(tmp_path, capsys, npy_calib, demo_copy):
    from ppqlike.optim.setting import QuantizationSetting
    before = _state(demo_copy)
    setting = tmp_path / "setting.json"
    QuantizationSetting(activation_observer="percentile").save(setting)
    table = tmp_path / "table.txt"
    table.write_text("# keep the classifier in float\nfc FP32\n")
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, "quantize", demo_copy, "--platform", "TRT-INT8", "--calib", npy_calib,
                             "--out", out, "--batch-size", 16, "--calib-steps", 3, "--setting", setting,
                             "--dispatch-table", table, "--observer", "minmax", "--input-shape", "1,1,8,8")
    assert code == 0, err
    assert _state(demo_copy) == before
    assert sorted(os.listdir(out)) == ["digits.trt_int8.dynamic_range.json", "digits.trt_int8.json",
                                       "digits.trt_int8.onnx", "report.html", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ops"] == {"TARGET": 10, "FP32": 1, "SOI": 0}
    assert summary["calibration"]["samples"] == 64 and summary["calibration"]["batches_used"] == 3
    assert "10 on TRT_INT8 (TARGET), 1 FP32, 0 SOI" in stdout and str(out / "digits.trt_int8.onnx") in stdout
    config = json.loads((out / "digits.trt_int8.json").read_text())
    assert config["setting"]["activation_observer"] == "minmax"  # --observer beats --setting
    images, labels = load_demo_data("test")
    logits = _session(out / "digits.trt_int8.onnx").run(None, {"image": images})[0]
    assert np.mean(logits.argmax(1) == labels) > 0.95


def test_accuracy_target_and_recipe_options_reach_the_setting_and_the_summary(tmp_path, capsys, npy_calib,
                                                                             demo_copy):
    out = tmp_path / "out"
    code, _, err = _run(capsys, "quantize", demo_copy, "--platform", "ACADEMIC_W4A8", "--calib", npy_calib,
                        "--out", out, "--batch-size", 16, "--calib-steps", 3, "--input-shape", "1,1,8,8",
                        "--accuracy-target", 0.9999, "--recipe", "plain", "--time-budget", 0)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    moved = summary["moved_to_fp32_for_accuracy_target"]
    assert summary["recipe"]["recipe"] == "plain" and moved  # W4A8 cannot keep 0.9999 without moving ops
    exported = onnx.load(str(next(out.glob("*.onnx"))))
    quantized_inputs = {n.output[0] for n in exported.graph.node if n.op_type == "DequantizeLinear"}
    moved_compute = [n for n in exported.graph.node if n.name in moved and n.op_type in ("Conv", "Gemm")]
    assert moved_compute  # found in the exported model by name, and reading no dequantized tensor
    for node in moved_compute:
        assert not set(node.input) & quantized_inputs, node.name
    assert "mixed_precision" in [p["name"] for p in summary["passes"]]


def _rgb_model(path):
    weight = numpy_helper.from_array(np.random.default_rng(1).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="gap")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 1, 1])], [weight])
    path.write_bytes(model.SerializeToString())
    return path


def test_quantize_image_folder_skips_other_files(tmp_path, capsys):
    from PIL import Image
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(3):
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(folder / f"i{index}.png")
    (folder / "labels.csv").write_text("a,b\n")
    model = _rgb_model(tmp_path / "rgb.onnx")
    code, out, err = _run(capsys, "quantize", model, "--calib", folder, "--out", tmp_path / "o", "--platform",
                          "ort_int8", "--scale", 255, "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225",
                          "--bgr", "--batch-size", 2, "--quiet")
    assert code == 0, err
    assert "ppqlike: warning: " in err and "labels.csv" in err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["calibration"]["skipped_files"] == ["labels.csv"] and summary["calibration"]["batches"] == 2
    assert summary["ops"]["TARGET"] == 2 and summary["ops"]["FP32"] == 1   # the op writing the output: float


@requires_bench
def test_quantize_shared_mobilenetv2(tmp_path, capsys):
    calib = tmp_path / "calib"
    calib.mkdir()
    for name in sorted(os.listdir(BENCH_DIR / "images" / "calib"))[:16]:
        os.symlink(BENCH_DIR / "images" / "calib" / name, calib / name)
    model = BENCH_DIR / "models" / "mobilenetv2.onnx"
    before = _state(model)
    out = tmp_path / "out"
    started = time.perf_counter()
    code, stdout, err = _run(capsys, "quantize", model, "--platform", "trt_int8", "--calib", calib, "--out", out,
                             "--resize", 256, "--crop", 224, "--scale", 255, "--mean", "0.485,0.456,0.406",
                             "--std", "0.229,0.224,0.225", "--batch-size", 16)
    seconds = time.perf_counter() - started
    assert code == 0, err
    print(f"shared MobileNetV2 CLI run: {seconds:.1f} s")
    assert _state(model) == before
    assert "[ppqlike] calibration" in stdout  # per-pass progress lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calibration"]["samples"] == 16 and summary["calibration"]["batches"] == 1
    assert summary["ops"]["TARGET"] > 100 and summary["ops"]["SOI"] >= 1
    assert os.path.isfile(summary["files"]["model"]) and os.path.isfile(summary["files"]["config"])
    images, _, _ = load_images("mobilenetv2", "dev", 16)
    quantized = _session(summary["files"]["model"]).run(None, {"input": np.asarray(images)})[0]
    reference = _session(model).run(None, {"input": np.asarray(images)})[0]
    assert np.mean(quantized.argmax(1) == reference.argmax(1)) >= 0.75


# ------------------------------------------------------------------------------------------ bad input
def _expect_error(capsys, argv, *fragments, out_dir=None, model=DEMO):
    before = _state(model) if os.path.isfile(model) else None
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("ppqlike: error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    if before is not None:
        assert _state(model) == before
    if out_dir is not None:
        assert not os.path.exists(out_dir)
    return lines[0]


def _folder_with(tmp_path, name, **arrays):
    folder = tmp_path / name
    folder.mkdir()
    for file_name, array in arrays.items():
        if file_name.endswith("_npz"):
            np.savez(folder / (file_name[:-4] + ".npz"), **array)
        else:
            np.save(folder / f"{file_name}.npy", array)
    return folder


def test_bad_calibration_data(tmp_path, capsys, npy_calib):
    out = tmp_path / "out"
    good = load_demo_data("calibration")[0][:8]
    poisoned = good.copy()
    poisoned[2, 0, 3, 3] = np.inf
    cases = [
        (_folder_with(tmp_path, "empty"), ["holds no images", "it is empty"]),
        (_folder_with(tmp_path, "text"), ["holds no images"]),
        (_folder_with(tmp_path, "nan", a=good, b=np.full_like(good, np.nan)), ["b.npy", "NaN or Inf"]),
        (_folder_with(tmp_path, "inf", a=poisoned), ["a.npy", "NaN or Inf"]),
        (_folder_with(tmp_path, "rank", a=good[:, 0, 0]), ["a.npy", "rank 4 (a batch) or 3 (one sample)"]),
        (_folder_with(tmp_path, "shape", a=good[:, :, :5]), ["a.npy", "[1, 8, 8]", "[8, 1, 5, 8]"]),
        (_folder_with(tmp_path, "names", x_npz={"img": good, "other": good}), ["x.npz", "['image']"]),
        (tmp_path / "missing", ["does not exist"]),
    ]
    (tmp_path / "text" / "notes.txt").write_text("no data")
    for folder, fragments in cases:
        _expect_error(capsys, ["quantize", DEMO, "--calib", folder, "--out", out, "--quiet"], *fragments,
                      out_dir=out)
    _expect_error(capsys, ["quantize", DEMO, "--calib", npy_calib, "--out", out, "--calib-steps", 5],
                  "--calib-steps 5", "at most 4", out_dir=out)


def test_bad_platform_paths_and_options(tmp_path, capsys, npy_calib, demo_copy):
    out = tmp_path / "out"
    base = ["quantize", demo_copy, "--calib", npy_calib, "--quiet"]
    blocker = tmp_path / "a_file"
    blocker.write_text("I am a file")
    _expect_error(capsys, base + ["--out", out, "--platform", "tensorrt"], "unknown platform 'tensorrt'",
                  "trt_int8", "ort_int8", "academic_w4a8", out_dir=out, model=demo_copy)
    _expect_error(capsys, base + ["--out", out, "--platform", "fp32"], "not a quantization target", out_dir=out,
                  model=demo_copy)
    _expect_error(capsys, base + ["--out", blocker / "sub" / "dir"], "is a file, not a folder", model=demo_copy)
    assert blocker.read_text() == "I am a file"
    _expect_error(capsys, base + ["--out", demo_copy], "it is the input model", model=demo_copy)
    _expect_error(capsys, base + ["--out", demo_copy.parent, "--model-name", demo_copy.name],
                  "refusing to write", "it is the input model", model=demo_copy)
    _expect_error(capsys, ["quantize", tmp_path / "none.onnx", "--calib", npy_calib, "--out", out],
                  "none.onnx", "does not exist", out_dir=out)
    _expect_error(capsys, base + ["--out", out, "--observer", "magic"], "activation_observer 'magic'",
                  out_dir=out, model=demo_copy)
    _expect_error(capsys, base + ["--out", out, "--dispatcher", "random"], "dispatcher 'random'",
                  out_dir=out, model=demo_copy)
    table = tmp_path / "table.txt"
    table.write_text("fc\n")
    _expect_error(capsys, base + ["--out", out, "--dispatch-table", table], "line 1", out_dir=out, model=demo_copy)
    table.write_text('{"no_such_op": "FP32"}')
    _expect_error(capsys, base + ["--out", out, "--dispatch-table", table], "no_such_op", out_dir=out,
                  model=demo_copy)
    bad_setting = tmp_path / "setting.json"
    bad_setting.write_text('{"colour": "blue"}')
    _expect_error(capsys, base + ["--out", out, "--setting", bad_setting], "unknown setting keys ['colour']",
                  out_dir=out, model=demo_copy)
    # argparse's own errors: one line, status 2
    _expect_error(capsys, ["quantize", demo_copy, "--out", out], "--calib", "ppqlike quantize --help",
                  out_dir=out, model=demo_copy)
    _expect_error(capsys, base + ["--out", out, "--mean", "1,2"], "one number or three", out_dir=out,
                  model=demo_copy)
    _expect_error(capsys, base + ["--out", out, "--batch-size", "0"], "must be positive", out_dir=out,
                  model=demo_copy)
    _expect_error(capsys, ["frobnicate"], "invalid choice")


def test_failed_export_writes_nothing(tmp_path, capsys, npy_calib, demo_copy, monkeypatch):
    def broken(graph, platform, model_path, config_path):
        with open(model_path, "wb") as handle:
            handle.write(b"half a model")
        raise ExportError("the disk is on fire")

    monkeypatch.setattr(cli_export, "export_quantized", broken)
    out = tmp_path / "new" / "out"
    _expect_error(capsys, ["quantize", demo_copy, "--calib", npy_calib, "--out", out, "--quiet"],
                  "the disk is on fire", out_dir=tmp_path / "new", model=demo_copy)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    _expect_error(capsys, ["quantize", demo_copy, "--calib", npy_calib, "--out", existing, "--quiet"],
                  "the disk is on fire", model=demo_copy)
    assert os.listdir(existing) == ["keep.txt"]


def test_platform_exporter_and_its_extras(tmp_path, capsys, npy_calib, demo_copy, monkeypatch):
    """The CLI exports through the platform's exporter; its warnings become notes, its extra files are listed."""
    import warnings

    from ppqlike.export.platform import export_for_platform
    calls = []

    def exporter(graph, platform, graph_save_to, config_save_to=None):
        calls.append((platform, os.path.basename(graph_save_to), os.path.basename(config_save_to)))
        written = export_for_platform(graph, platform, graph_save_to, config_save_to)
        with open(os.path.splitext(graph_save_to)[0] + ".cache", "w") as handle:
            handle.write("ranges")
        warnings.warn("rounding differs on ties")
        return written

    monkeypatch.setattr(cli_export, "export_for_platform", exporter)
    out = tmp_path / "out"
    code, stdout, err = _run(capsys, "quantize", demo_copy, "--calib", npy_calib, "--out", out, "--quiet",
                             "--platform", "ort_int8")
    assert code == 0, err
    assert [(p.name, m, c) for p, m, c in calls] == [("ORT_INT8", "digits.ort_int8.onnx", "digits.ort_int8.json")]
    assert sorted(os.listdir(out)) == ["digits.ort_int8.cache", "digits.ort_int8.json", "digits.ort_int8.onnx",
                                       "report.html", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["files"]["extras"] == [str(out / "digits.ort_int8.cache")]
    assert summary["exporter"] == "ppqlike.export_ppq_graph"
    assert summary["export_notes"] == ["rounding differs on ties"] and "rounding differs on ties" in stdout


def test_help_and_console_entry(capsys):
    code, out, _ = _run(capsys, "quantize", "--help")
    assert code == 0 and "x' = (x / scale - mean) / std" in out and "--dispatch-table" in out
    result = subprocess.run([sys.executable, "-m", "ppqlike", "quantize", "missing.onnx", "--calib", ".",
                             "--out", "o"], capture_output=True, text=True, cwd=REPO, timeout=60,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert result.returncode == 2
    assert result.stderr.strip() == "ppqlike: error: model file 'missing.onnx' does not exist"
