"""quantize_onnx_model on bad calibration data, platforms and model paths: each a clear ppqlike error.

The input model is never modified and nothing is written anywhere (the tests
run in an empty working directory and compare it before and after).
"""

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from ppqlike.api import quantize_onnx_model
from ppqlike.cli.main import _data_path, load_demo_data
from ppqlike.core.errors import CalibrationDataError, ModelLoadError, PlatformError, PPQLikeError
from ppqlike.io.calibration_data import CalibrationFolder
from ppqlike.optim.base import CalibrationRepeatWarning

DEMO = _data_path("demo_model.onnx")


@pytest.fixture(scope="module")
def calib():
    return load_demo_data("calibration")[0][:16]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _state(path):
    with open(path, "rb") as handle:
        return handle.read(), os.stat(path).st_mtime_ns


def _expect(workdir, error, fragments, model=DEMO, **kwargs):
    before_model = _state(model) if os.path.isfile(model) else None
    before_dir = sorted(os.listdir(workdir))
    with pytest.raises(error) as info:
        quantize_onnx_model(model, **kwargs)
    assert isinstance(info.value, PPQLikeError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if before_model is not None:
        assert _state(model) == before_model
    assert sorted(os.listdir(workdir)) == before_dir
    return message


def _nan(batch):
    batch = batch.copy()
    batch[3, 0, 2, 2] = np.nan
    return batch


@pytest.mark.parametrize("make, fragments", [
    (lambda c: [{"img": c}], ["names ['img']", "inputs of", "['image']"]),
    (lambda c: [{"image": c, "extra": c}], ["names ['extra']"]),
    (lambda c: [c[:, 0]], ["'image' must have rank 4", "got shape [16, 8, 8]"]),
    (lambda c: [c[:, :, :4]], ["'image' must have shape", "got [16, 1, 4, 8]"]),
    (lambda c: [np.repeat(c, 3, axis=1)], ["got [16, 3, 8, 8]"]),
    (lambda c: [], ["yielded no batch"]),
    (lambda c: iter(()), ["yielded no batch"]),
    (lambda c: [c[:8], _nan(c)], ["'image' holds NaN or Inf"]),
    (lambda c: [np.full_like(c, np.inf)], ["NaN or Inf"]),
    (lambda c: [np.full_like(c, -np.inf)], ["NaN or Inf"]),
], ids=["name", "extra-name", "rank", "shape", "channels", "empty-list", "empty-iterator", "nan", "inf", "-inf"])
def test_bad_calibration_batches(workdir, calib, make, fragments):
    _expect(workdir, CalibrationDataError, fragments, calib_dataloader=make(calib), platform="ort_int8")


def test_calib_steps_larger_than_the_data(workdir, calib):
    # a list shorter than calib_steps is run again (PPQ's way, one warning line: tests/test_ppq_face.py);
    # a generator cannot be, and says so
    batches = [calib[:8], calib[8:]]
    _expect(workdir, CalibrationDataError, ["calib_steps is 3", "yielded only 2", "cannot be run again"],
            calib_dataloader=(b for b in batches), calib_steps=3)  # no len(): found out while iterating
    _expect(workdir, CalibrationDataError, ["calib_steps must be positive"], calib_dataloader=batches, calib_steps=0)


def test_input_shape_checked(workdir, calib):
    # the batch dimension may vary (a last, smaller batch); the others must match
    _expect(workdir, CalibrationDataError, ["must have shape [4, 1, 4, 4]", "got [16, 1, 8, 8]"],
            calib_dataloader=[calib], input_shape=[4, 1, 4, 4])


@pytest.mark.parametrize("name", ["foo", "trt", "int8", 3])
def test_unknown_platform_lists_the_valid_ones(workdir, calib, name):
    message = _expect(workdir, PlatformError, [f"unknown target platform {name!r}", "TRT_INT8", "ORT_INT8"],
                      calib_dataloader=[calib], platform=name)
    assert "valid names are" in message


@pytest.mark.parametrize("name", ["fp32", "SOI", "unspecified"])
def test_internal_labels_are_no_platform(workdir, calib, name):
    _expect(workdir, PlatformError, ["is not a quantization target", "TRT_INT8"], calib_dataloader=[calib],
            platform=name)


def test_bad_dispatcher_and_observer(workdir, calib):
    from ppqlike.optim.setting import QuantizationSetting
    _expect(workdir, PlatformError, ["dispatcher 'foo'", "conservative"], calib_dataloader=[calib], dispatcher="foo")
    with pytest.raises(PlatformError, match="activation_observer 'bar'"):
        QuantizationSetting(activation_observer="bar")
    _expect(workdir, PlatformError, ["does not have", "no_such_op"], calib_dataloader=[calib],
            setting=QuantizationSetting(dispatching_table={"no_such_op": "FP32"}))


def test_missing_or_unreadable_model(workdir, calib):
    _expect(workdir, ModelLoadError, ["missing.onnx", "no such file"], model=str(workdir / "missing.onnx"),
            calib_dataloader=[calib])
    _expect(workdir, ModelLoadError, ["not a file"], model=str(workdir), calib_dataloader=[calib])
    text = workdir / "notes.onnx"
    text.write_text("this is not a model\n")
    _expect(workdir, ModelLoadError, ["notes.onnx", "not an ONNX model"], model=str(text), calib_dataloader=[calib])


def _two_input_model(path):
    weight = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["a", "w"], ["ca"], name="conv_a"),
             helper.make_node("Conv", ["b", "w"], ["cb"], name="conv_b"),
             helper.make_node("Add", ["ca", "cb"], ["y"], name="add")]
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3, 4, 4]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 4, 4])], [weight])
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_multi_input_batches(workdir, tmp_path_factory):
    model = _two_input_model(tmp_path_factory.mktemp("model") / "two.onnx")
    x = np.random.default_rng(0).normal(size=(4, 3, 4, 4)).astype(np.float32)
    _expect(workdir, CalibrationDataError, ["lacks inputs ['b']"], model=model, calib_dataloader=[{"a": x}])
    _expect(workdir, CalibrationDataError, ["has 3 arrays", "2 inputs"], model=model, calib_dataloader=[(x, x, x)])
    _expect(workdir, CalibrationDataError, ["2 inputs", "dict of input name"], model=model, calib_dataloader=[x])
    _expect(workdir, CalibrationDataError, ["'b' must have rank 4"], model=model,
            calib_dataloader=[{"a": x, "b": x[0]}])
    graph = quantize_onnx_model(model, [{"a": x, "b": x}, (x, x)], platform="ort_int8")  # both forms work
    assert graph.metadata["quantization"]["dispatch"]["counts"]["TARGET"] >= 2


def test_calibration_folder_as_dataloader(workdir, tmp_path_factory, calib):
    """A CalibrationFolder is an ordinary dataloader; its own checks name the file at fault."""
    folder = tmp_path_factory.mktemp("calib")
    np.save(folder / "a.npy", calib[:10])
    np.save(folder / "b.npy", calib[10])  # one sample
    data = CalibrationFolder(folder, {"image": ["N", 1, 8, 8]}, batch_size=4)
    graph = quantize_onnx_model(DEMO, data, calib_steps=2, platform="ort_int8")
    assert graph.metadata["quantization"]["platform"] == "ORT_INT8"
    with pytest.warns(CalibrationRepeatWarning, match="calib_steps is 4 but the dataloader holds 3 batches"):
        quantize_onnx_model(DEMO, data, calib_steps=4, platform="ort_int8")  # run again, as PPQ does
    np.save(folder / "c.npy", _nan(calib))  # the folder is listed once, when the CalibrationFolder is made
    _expect(workdir, CalibrationDataError, ["c.npy", "NaN or Inf"],
            calib_dataloader=CalibrationFolder(folder, {"image": ["N", 1, 8, 8]}, batch_size=4))
