"""Reliability (docs/RELIABILITY.md): inputs never modified, outputs whole or absent, every bad input named.

One test (or a few) per fault class found by a suite of bad inputs: links to the input model, half-written
exports, SIGTERM, NaN weights, absurd declared sizes, 16-bit images, settings of the wrong type, models without
inputs, unquantized exports, external data outside the model's folder, already quantized models and a fixed
batch size under the command line's default.
"""

from __future__ import annotations

import hashlib
import os
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model
from ppqlike.core.errors import (CalibrationDataError, ExportError, GraphError, ModelLoadError, PlatformError,
                                 PPQLikeError)


def conv_model(batch="N", weight: np.ndarray | None = None) -> onnx.ModelProto:
    """x [batch, 3, 8, 8] -> Conv(4, 3x3) -> Relu -> y."""
    if weight is None:
        weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])],
                      [numpy_helper.from_array(weight, "w")])


def batches(count=2, size=4):
    rng = np.random.default_rng(1)
    return [rng.standard_normal((size, 3, 8, 8)).astype(np.float32) for _ in range(count)]


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


# 1. data loss through links ------------------------------------------------------------------------------------
def test_export_through_a_link_never_overwrites_the_input_model(tmp_path):
    real = tmp_path / "real" / "model.onnx"
    real.parent.mkdir()
    onnx.save(conv_model(), str(real))
    link = tmp_path / "link.onnx"
    os.symlink(real, link)
    before = sha(real)
    graph = ppqlike.quantize_onnx_model(str(link), batches(), platform="ORT_INT8")
    for target in (real, tmp_path / "real" / ".." / "real" / "model.onnx"):
        with pytest.raises(ExportError, match="input model"):
            ppqlike.export_ppq_graph(graph, "ORT_INT8", str(target))
    other = tmp_path / "other.onnx"
    os.symlink(real, other)  # a link elsewhere that points at the input
    with pytest.raises(ExportError, match="input model"):
        ppqlike.export_ppq_graph(graph, "ORT_INT8", str(other))
    assert sha(real) == before


# 2. outputs whole or absent ------------------------------------------------------------------------------------
def test_export_writes_all_files_or_none(tmp_path):
    graph = ppqlike.quantize_onnx_model(conv_model(), batches(), platform="TRT_INT8")
    with pytest.raises(ExportError, match="does not exist"):
        ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"), str(tmp_path / "missing" / "m.json"))
    assert listing(tmp_path) == []  # neither the model nor the dynamic-range file, no temporary file
    with pytest.raises(ExportError, match="share the path"):
        ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx"))
    assert listing(tmp_path) == []
    written = ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"), str(tmp_path / "m.json"))
    assert sorted(os.path.basename(p) for p in written) == listing(tmp_path) == \
        ["m.dynamic_range.json", "m.json", "m.onnx"]


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    import ppqlike.export.platform as platform_export
    graph = ppqlike.quantize_onnx_model(conv_model(), batches(), platform="TRT_INT8")

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # the user stops the run after the model was written
    monkeypatch.setattr(platform_export, "export_config_json", broken)
    with pytest.raises(KeyboardInterrupt):
        ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"), str(tmp_path / "m.json"))
    assert listing(tmp_path) == []


def test_sigterm_cleans_up_like_an_interrupt(tmp_path, monkeypatch, capsys):
    import ppqlike.cli.export as cli_export
    from ppqlike.cli import main
    model, calibration, out = tmp_path / "m.onnx", tmp_path / "calib", tmp_path / "out"
    onnx.save(conv_model(), str(model))
    calibration.mkdir()
    for index, batch in enumerate(batches()):
        np.save(calibration / f"{index}.npy", batch)
    real_export = cli_export.export_quantized

    def export_then_terminated(*args, **kwargs):
        result = real_export(*args, **kwargs)  # the model is in the staging folder when SIGTERM arrives
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    monkeypatch.setattr(cli_export, "export_quantized", export_then_terminated)
    previous = signal.getsignal(signal.SIGTERM)
    status = main(["quantize", str(model), "--platform", "ort_int8", "--calib", str(calibration), "--out", str(out),
                   "--quiet"])
    assert status == 143 and "terminated" in capsys.readouterr().err
    assert not out.exists()  # the run created it: staging folder and all are gone
    assert signal.getsignal(signal.SIGTERM) == previous


# 3. NaN weights are the model's fault, named -------------------------------------------------------------------
def test_nan_weight_names_the_tensor_and_the_op():
    weight = np.ones((4, 3, 3, 3), np.float32)
    weight[1, 0, 0, 0] = np.nan
    weight[2, 0, 0, 0] = np.inf
    with pytest.raises(GraphError, match=r"parameter 'w' of Conv node 'conv' holds 2 NaN/Inf"):
        ppqlike.quantize_onnx_model(conv_model(weight=weight), batches(), platform="TRT_INT8")


# 4. declared sizes checked before allocating -------------------------------------------------------------------
def test_sparse_initializer_declaring_a_huge_tensor_is_refused(tmp_path):
    model = conv_model()
    values = numpy_helper.from_array(np.ones(2, np.float32), "big")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "big_indices")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [10 ** 6, 10 ** 6]))
    path = tmp_path / "sparse.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"sparse tensor 'big'.*GiB"):
        ppqlike.load_onnx_graph(str(path))


def test_dense_initializer_whose_data_does_not_match_its_shape_is_refused():
    model = conv_model()
    tensor = model.graph.initializer[0]
    del tensor.dims[:]
    tensor.dims.extend([4, 3, 3, 3 * 10 ** 9])
    with pytest.raises(ModelLoadError, match=r"tensor name: w|tensor 'w'"):
        ppqlike.load_onnx_graph(model)


def test_npy_header_claiming_more_than_the_file_holds_is_refused(tmp_path):
    from ppqlike.io.calibration_data import CalibrationFolder
    header = {"descr": "<f4", "fortran_order": False, "shape": (1024, 3, 8, 8 * 10 ** 6)}
    with open(tmp_path / "huge.npy", "wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.write(b"\0" * 64)
    with pytest.raises(CalibrationDataError, match="huge.npy"):
        CalibrationFolder(tmp_path, {"x": ("N", 3, 8, 8)}, batch_size=1)
    header["shape"] = (4, 3, 8, 8)  # a plausible size, but truncated
    with open(tmp_path / "huge.npy", "wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.write(b"\0" * 64)
    with pytest.raises(CalibrationDataError, match="truncated"):
        CalibrationFolder(tmp_path, {"x": ("N", 3, 8, 8)}, batch_size=1)


# 5. 16-bit images are scaled, not clipped ----------------------------------------------------------------------
def test_16_bit_greyscale_png_is_scaled_to_8_bits(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    from ppqlike.io.images import load_image
    pixels = np.array([[0, 257, 32896], [65535, 1000, 50000]], np.uint16)
    image_module.fromarray(pixels).save(tmp_path / "grey16.png")
    loaded = load_image(tmp_path / "grey16.png", None, None)
    expected = np.rint(pixels / 257.0).astype(np.float32)
    for channel in range(3):
        np.testing.assert_array_equal(loaded[0, channel], expected)
    image_module.fromarray(np.ones((2, 2), np.float32), "F").save(tmp_path / "float.tiff")
    with pytest.raises(PPQLikeError, match="floating-point pixels"):
        load_image(tmp_path / "float.tiff", None, None)


# 6. settings: every field's type and range ---------------------------------------------------------------------
@pytest.mark.parametrize("field, value, message", [
    ("fusion", "no", "setting.fusion must be true or false"),
    ("fusion", 1, "setting.fusion must be true or false"),
    ("search_batches", "two", "setting.search_batches must be an integer"),
    ("search_batches", -1, "setting.search_batches must be a positive integer"),
    ("search_batches", True, "setting.search_batches must be an integer"),
    ("equalization_max_scale", "16", "setting.equalization_max_scale must be a finite number"),
    ("activation_observer", 3, "setting.activation_observer must be a string or null"),
    ("dispatching_table", [], "setting.dispatching_table must be an object"),
])
def test_settings_fields_are_validated_by_type(tmp_path, field, value, message):
    import json
    path = tmp_path / "setting.json"
    path.write_text(json.dumps({field: value}))
    with pytest.raises(PlatformError, match=message):
        ppqlike.QuantizationSetting.load(path)


# 7. nothing to quantize, nothing quantized ---------------------------------------------------------------------
def test_model_without_inputs_is_refused():
    nodes = [helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                       [numpy_helper.from_array(np.array([-1.0, 1.0], np.float32), "c")])
    with pytest.raises(GraphError, match="has no inputs"):
        ppqlike.quantize_onnx_model(model, batches(), platform="TRT_INT8")


def test_exporting_a_graph_never_quantized_is_refused(tmp_path):
    graph = ppqlike.load_onnx_graph(conv_model())
    with pytest.raises(ExportError, match="never quantized"):
        ppqlike.export_ppq_graph(graph, "TRT_INT8", str(tmp_path / "m.onnx"))
    assert listing(tmp_path) == []


# 8. external data stays inside the model's folder --------------------------------------------------------------
@pytest.mark.parametrize("location", ["sub/../../secret.bin", "../secret.bin", "link.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones(4 * 3 * 3 * 3, np.float32).tobytes())
    os.symlink(secret, folder / "link.bin")
    model = conv_model()
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="not inside the model's folder"):
        ppqlike.load_onnx_graph(str(path))


# 10. already quantized models; a fixed batch under the command line --------------------------------------------
def test_command_line_names_an_already_quantized_model_and_a_fixed_batch(tmp_path, capsys):
    from ppqlike.cli import main
    graph = ppqlike.quantize_onnx_model(conv_model(), batches(), platform="ORT_INT8")
    quantized = ppqlike.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "q.onnx"))[0]
    calibration = tmp_path / "calib"
    calibration.mkdir()
    np.save(calibration / "0.npy", batches(1, 1)[0])
    assert main(["quantize", quantized, "--calib", str(calibration), "--out", str(tmp_path / "o")]) == 2
    assert "already quantized" in capsys.readouterr().err and not (tmp_path / "o").exists()
    fixed = tmp_path / "fixed.onnx"
    onnx.save(conv_model(batch=1), str(fixed))
    assert main(["quantize", str(fixed), "--calib", str(calibration), "--out", str(tmp_path / "o"),
                 "--batch-size", "16"]) == 2
    assert "--batch-size 1" in capsys.readouterr().err
    assert main(["quantize", str(fixed), "--calib", str(calibration), "--out", str(tmp_path / "o"), "--quiet"]) == 0
