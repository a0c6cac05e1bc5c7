"""PPQ scripts as written: the functions of PPQ's ``ppq.api`` that ppqlike offers under the same name take
PPQ's parameters, in PPQ's order, and PPQ's calib_steps over a shorter dataloader runs it again.

The signatures below were copied by hand from PPQ's source, file ``ppq/api/interface.py`` at commit
e39eecb9f7e5f017c28f180cb423f8a685c3db48 of github.com/OpenPPL/ppq (2024-02-27), read with
``git show <commit>:ppq/api/interface.py``: every function there, its parameters in order, and whether it
takes ``**kwargs``.  ``ppq/api/__init__.py`` re-exports them with ``ppq/api/fsys.py``'s file helpers and
``ppq.lib``'s ``register_*`` functions, which ppqlike does not offer (docs/MIGRATING_FROM_PPQ.md).
"""

from __future__ import annotations

import enum
import inspect
import warnings

import numpy as np
import pytest

import ppqlike
import ppqlike.api
from ppqlike.core.errors import ModelLoadError, PPQLikeError, UnknownKeywordError
from ppqlike.optim.base import CalibrationRepeatWarning
from counting_loader import CountingLoader
from test_ppq_face import samples, small_model

PPQ_COMMIT = "e39eecb9f7e5f017c28f180cb423f8a685c3db48"

#: ppq/api/interface.py at PPQ_COMMIT: name -> (parameters in order, takes **kwargs)
PPQ_INTERFACE = {
    "load_graph": (["file_path", "from_framework"], True),
    "load_onnx_graph": (["onnx_import_file"], False),
    "load_caffe_graph": (["prototxt_path", "caffemodel_path"], False),
    "load_native_graph": (["import_file"], False),
    "load_torch_model": (["model", "onnx_file_name", "sample", "device", "verbose", "opset", "do_constant_folding",
                          "dynamic_axes", "training"], False),
    "dump_torch_to_onnx": (["model", "onnx_export_file", "input_shape", "input_dtype", "inputs", "device"], False),
    "quantize_onnx_model": (["onnx_import_file", "calib_dataloader", "calib_steps", "input_shape", "platform",
                             "input_dtype", "inputs", "setting", "collate_fn", "device", "verbose", "do_quantize"],
                            False),
    "quantize_torch_model": (["model", "calib_dataloader", "calib_steps", "input_shape", "platform", "input_dtype",
                              "setting", "collate_fn", "inputs", "do_quantize", "onnx_export_file", "device",
                              "verbose"], False),
    "quantize_caffe_model": (["caffe_proto_file", "caffe_model_file", "calib_dataloader", "calib_steps",
                              "input_shape", "platform", "input_dtype", "setting", "collate_fn", "inputs",
                              "do_quantize", "device", "verbose"], False),
    "quantize_native_model": (["model", "calib_dataloader", "calib_steps", "input_shape", "platform", "input_dtype",
                               "inputs", "setting", "collate_fn", "device", "verbose", "do_quantize"], False),
    "export_ppq_graph": (["graph", "platform", "graph_save_to", "config_save_to", "copy_graph"], True),
    "format_graph": (["graph"], False),
    "dispatch_graph": (["graph", "platform", "dispatcher", "dispatching_table"], False),
    "quantize": (["working_directory", "setting", "model_type", "executing_device", "input_shape",
                  "target_platform", "dataloader", "calib_steps"], False),
    "export": (["working_directory", "quantized", "platform"], True),
    "manop": (["graph", "list_of_passes", "calib_dataloader", "executor", "collate_fn"], True),
}

#: the ones ppqlike offers (``ppqlike.api`` and, where named, ``ppqlike``): the test fails if one goes missing
OFFERED = {"load_graph", "load_onnx_graph", "quantize_onnx_model", "export_ppq_graph", "dispatch_graph"}


def _offered(module, name):
    value = getattr(module, name, None)
    return value if inspect.isfunction(value) else None


@pytest.mark.parametrize("module", [ppqlike.api, ppqlike], ids=["ppqlike.api", "ppqlike"])
def test_offered_functions_take_ppqs_parameters_in_ppqs_order(module):
    offered = {name for name in PPQ_INTERFACE if _offered(module, name)}
    if module is ppqlike.api:
        assert offered == OFFERED
    else:
        assert offered <= OFFERED and {"load_onnx_graph", "quantize_onnx_model", "dispatch_graph"} <= offered
    for name in sorted(offered):
        parameters, takes_kwargs = PPQ_INTERFACE[name]
        signature = inspect.signature(_offered(module, name))
        positional = [p.name for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        # a PPQ call by position lands on the same parameters; ppqlike's own come after PPQ's
        assert positional[:len(parameters)] == parameters, (name, positional, parameters)
        assert not any(p.kind is p.POSITIONAL_ONLY for p in signature.parameters.values()), name
        if takes_kwargs:
            assert any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()), name


def test_ppq_keywords_work_by_name(tmp_path):
    from ppqlike import QuantizationSettingFactory, TargetPlatform
    path = small_model(tmp_path / "model.onnx")

    class NetworkFramework(enum.Enum):  # PPQ's enum, as a script passes it
        ONNX = 1
        CAFFE = 2

    graph = ppqlike.api.load_onnx_graph(onnx_import_file=path)
    assert set(graph.operations) >= {"conv1", "fc"}
    graph = ppqlike.api.load_graph(file_path=path, from_framework=NetworkFramework.ONNX)
    assert ppqlike.api.dispatch_graph(graph=graph, platform=TargetPlatform.TRT_INT8, dispatcher="conservative",
                                      dispatching_table={"fc": "FP32"}) is graph
    assert graph.operations["fc"].platform is TargetPlatform.FP32
    assert graph.operations["conv1"].platform is TargetPlatform.TRT_INT8
    # PPQ's documentation passes the setting third: its dispatcher and table are used
    setting = QuantizationSettingFactory.trt_setting()
    setting.dispatching_table.append(operation="conv1", platform=TargetPlatform.FP32)
    ppqlike.dispatch_graph(ppqlike.load_onnx_graph(path), TargetPlatform.TRT_INT8, setting)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = ppqlike.api.quantize_onnx_model(
            onnx_import_file=path, calib_dataloader=samples(4), calib_steps=4, input_shape=[1, 3, 16, 16],
            platform=TargetPlatform.TRT_INT8, input_dtype="float32", inputs=samples(1)[0], setting=None,
            collate_fn=None, device="cuda", verbose=0, do_quantize=True)
        fp32 = ppqlike.api.quantize_onnx_model(path, samples(4), 4, [1, 3, 16, 16], TargetPlatform.TRT_INT8,
                                               None, None, None, None, "cpu", 0, False)  # PPQ's positions
    assert quantized.operations["conv1"].config is not None
    assert fp32.operations["conv1"].config is None  # do_quantize=False, twelfth by position
    written = ppqlike.api.export_ppq_graph(graph=quantized, platform=TargetPlatform.TRT_INT8,
                                           graph_save_to=str(tmp_path / "q.onnx"),
                                           config_save_to=str(tmp_path / "q.json"), copy_graph=True)
    assert written[0].endswith("q.onnx")


def test_ppq_keywords_ppqlike_cannot_honour_are_refused_with_the_reason(tmp_path):
    path = small_model(tmp_path / "model.onnx")
    with pytest.raises(ModelLoadError, match="reads ONNX models only"):
        ppqlike.api.load_graph(file_path=path, from_framework="CAFFE")
    with pytest.raises(UnknownKeywordError, match="caffemodel_path=...\\) loads a Caffe model"):
        ppqlike.api.load_graph(path, caffemodel_path="model.caffemodel")
    with pytest.raises(UnknownKeywordError, match="load_graph\\(\\) got an unknown keyword 'opset'"):
        ppqlike.api.load_graph(path, opset=13)
    with pytest.raises(TypeError):  # Python's own, for a keyword PPQ's quantize_onnx_model does not have either
        ppqlike.api.quantize_onnx_model(path, samples(4), calib_step=4)


def test_calib_steps_beyond_the_dataloader_runs_it_again_with_one_warning_line(tmp_path):
    # PPQ's samples: calib_steps=32 over a dataloader of 4 batches.  PPQ's RuntimeCalibrationPass runs
    # ceil(32 / 4) = 8 epochs, stopping at 32 batches; ppqlike does the same, said once, in one line.
    from ppqlike import QuantizationSettingFactory, TargetPlatform
    path = small_model(tmp_path / "model.onnx")
    data = samples(16, (1, 3, 16, 16))
    batches = [np.concatenate(data[i:i + 4]) for i in range(0, 16, 4)]
    setting = QuantizationSettingFactory.trt_setting()
    setting.recipe = "plain"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = ppqlike.quantize_onnx_model(onnx_import_file=path, calib_dataloader=batches, calib_steps=32,
                                                input_shape=[4, 3, 16, 16], platform=TargetPlatform.TRT_INT8,
                                                setting=setting)
    repeats = [w for w in caught if issubclass(w.category, CalibrationRepeatWarning)]
    assert len(repeats) == 1, [str(w.message) for w in caught]
    message = str(repeats[0].message)
    assert "calib_steps is 32 but the dataloader holds 4 batches: it is run 8 times for 32 batches" in message
    assert "\n" not in message
    calibrated = quantized.operations["relu1"].config.output_quantization_config[0].scale
    assert calibrated is not None

    # the calibration pass alone, as a PPQ pipeline script runs it: exactly 32 batches, 8 times each of the 4
    from ppqlike import NumpyExecutor
    from ppqlike.quantization.optim import RuntimeCalibrationPass
    from ppqlike.platforms import dispatch_graph as platform_dispatch
    from ppqlike.platforms.policies import get_quantizer
    from ppqlike.optim.recipe import format_for_quantization
    for steps, expected_epochs in ((32, 8), (10, 3)):
        graph = ppqlike.load_onnx_graph(path)
        format_for_quantization(graph, setting)
        quantizer = get_quantizer(TargetPlatform.TRT_INT8)
        platform_dispatch(graph, TargetPlatform.TRT_INT8, quantizer.policy.quantizable_types)
        quantizer.quantize(graph)
        loader = CountingLoader(batches)
        seen = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            RuntimeCalibrationPass().optimize(graph=graph, dataloader=loader, executor=NumpyExecutor(graph),
                                              calib_steps=steps, collate_fn=lambda b: seen.append(id(b)) or b)
        assert loader.made == steps and len(seen) == steps
        assert seen == [id(b) for b in (batches * expected_epochs)[:steps]]
        assert [str(w.message).count("\n") for w in caught if w.category is CalibrationRepeatWarning] == [0]
        assert f"run {expected_epochs} times for {steps} batches" in str(
            next(w.message for w in caught if w.category is CalibrationRepeatWarning))


def test_a_one_shot_dataloader_shorter_than_calib_steps_is_an_error(tmp_path):
    path = small_model(tmp_path / "model.onnx")
    with pytest.raises(PPQLikeError, match="yielded only 2 batches and cannot be run again"):
        ppqlike.quantize_onnx_model(path, (b for b in samples(2)), calib_steps=5)


def test_ppq_lib_pipeline_with_calib_steps_32_over_4_batches(tmp_path):
    # PPQ's QuantZoo scripts: PFL.Pipeline([...]).optimize(..., calib_steps=32) over a short calibration loader
    import ppqlike.lib as PFL
    from ppqlike import TargetPlatform, TorchExecutor, load_onnx_graph
    from ppqlike.quantization.optim import ParameterQuantizePass, RuntimeCalibrationPass
    graph = load_onnx_graph(onnx_import_file=small_model(tmp_path / "model.onnx"))
    quantizer = PFL.Quantizer(platform=TargetPlatform.TRT_INT8, graph=graph)
    for name, op in graph.operations.items():
        if op.type in {"Conv", "Gemm"}:
            quantizer.quantize_operation(name, platform=TargetPlatform.TRT_INT8)
    loader = CountingLoader(samples(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PFL.Pipeline([ParameterQuantizePass(), RuntimeCalibrationPass()]).optimize(
            graph=graph, dataloader=loader, verbose=False, calib_steps=32, collate_fn=lambda x: x.to("cpu"),
            executor=TorchExecutor(graph=graph))
    assert loader.made == 32
    repeats = [str(w.message) for w in caught if w.category is CalibrationRepeatWarning]
    assert len(repeats) == 1 and "holds 4 batches: it is run 8 times for 32 batches" in repeats[0]
    assert graph.operations["conv1"].config.output_quantization_config[0].scale is not None  # calibrated
