"""PPQ's face: scripts written in the style of PPQ's samples (its API script, its onnxruntime/TensorRT PTQ
examples, its hand-composed ``ppq.lib`` pipeline) run with only their imports, data and device strings changed.

The scripts are this project's own, written as a PPQ user writes them; each checks what it produced against
onnxruntime running the exported file, or against ppqlike's own names.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from shared_bench import PRESETS, load_images, requires_bench

pytestmark = pytest.mark.filterwarnings("ignore::ppqlike.core.compat.PPQCompatibilityWarning")


def small_model(path) -> str:
    """x [N, 3, 16, 16] -> Conv -> Relu -> Conv -> Clip -> GlobalAveragePool -> Flatten -> Gemm -> y."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
                 numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
                 numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w2"),
                 numpy_helper.from_array(np.float32(0.0), "low"), numpy_helper.from_array(np.float32(6.0), "high"),
                 numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "w3"),
                 numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "b3")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c2", "low", "high"], ["r2"], name="clip2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], constants)
    onnx.save(model, str(path))
    return str(path)


def samples(count=16, shape=(1, 3, 16, 16)):
    rng = np.random.default_rng(1)
    return [rng.uniform(0, 1, shape).astype(np.float32) for _ in range(count)]


def run(path, data) -> np.ndarray:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: data})[0]


def test_api_script_in_the_style_of_ppqs_quantize_onnx_model(tmp_path):
    # --- the script, as a PPQ user writes it (torch DataLoader -> a list of batches) ---
    from ppqlike import BaseGraph, QuantizationSettingFactory, TargetPlatform
    from ppqlike.api import export_ppq_graph, quantize_onnx_model

    BATCHSIZE, INPUT_SHAPE, DEVICE = 4, [3, 16, 16], "cpu"
    PLATFORM = TargetPlatform.PPL_CUDA_INT8
    ONNX_PATH = small_model(tmp_path / "model.onnx")

    def collate_fn(batch):
        return batch.to(DEVICE)  # a torch habit: numpy batches have no .to; skipped with a note

    quant_setting = QuantizationSettingFactory.pplcuda_setting()
    quant_setting.equalization = True
    quant_setting.dispatcher = "conservative"
    dataset = samples(16, INPUT_SHAPE)
    dataloader = [np.stack(dataset[i:i + BATCHSIZE]) for i in range(0, 16, BATCHSIZE)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = quantize_onnx_model(
            onnx_import_file=ONNX_PATH, calib_dataloader=dataloader, calib_steps=4,
            input_shape=[BATCHSIZE] + INPUT_SHAPE, setting=quant_setting, collate_fn=collate_fn,
            platform=PLATFORM, device=DEVICE, verbose=0)
    assert isinstance(quantized, BaseGraph)
    written = export_ppq_graph(graph=quantized, platform=PLATFORM, graph_save_to=str(tmp_path / "q.onnx"),
                               config_save_to=str(tmp_path / "q.json"))
    # --- checks ---
    assert any("collate_fn" in str(w.message) for w in caught)
    passes = [p["name"] for p in quantized.metadata["quantization"]["passes"]]
    assert "equalization" in passes
    from ppqlike import NumpyExecutor
    batch = dataloader[0]
    simulated = NumpyExecutor(quantized)(batch)[0]
    exported = run(written[0], batch)
    from ppqlike.export import output_steps   # (the op writing y runs in float: the step of what it reads)
    assert np.abs(simulated - exported).max() <= 2 * float(output_steps(quantized)["y"]) + 1e-6


#: a PTQ script in the style of PPQ's Onnxruntime/TensorRT Example_PTQ.py (star imports, PPQ_CONFIG branch,
#: nested setting, ENABLE_CUDA_KERNEL, analysis with PPQ's keywords, export, onnxruntime run by input names)
PTQ_SCRIPT = """
import numpy as np
import onnxruntime
from ppqlike import *
from ppqlike.api import *

QUANT_PLATFROM = TargetPlatform.ONNXRUNTIME
INPUT_SHAPE    = [1, 3, 16, 16]
SAMPLES        = [np.random.default_rng(i).uniform(0, 1, INPUT_SHAPE).astype(np.float32) for i in range(32)]
FINETUNE       = False
QS             = QuantizationSettingFactory.default_setting()
EXECUTING_DEVICE = 'cpu'

if PPQ_CONFIG.USING_CUDA_KERNEL:
    QS.advanced_optimization = FINETUNE
    QS.advanced_optimization_setting.steps = 2500
else:
    QS.lsq_optimization = FINETUNE
    QS.lsq_optimization_setting.epochs = 30
    QS.lsq_optimization_setting.collecting_device = 'cpu'
if QUANT_PLATFROM in {TargetPlatform.PPL_DSP_INT8, TargetPlatform.SNPE_INT8, TargetPlatform.FPGA_INT8}:
    QS.equalization = True
QS.dispatching_table.append(operation='fc', platform=TargetPlatform.FP32)
QS.quantize_activation_setting.calib_algorithm = 'percentile'

with ENABLE_CUDA_KERNEL():
    qir = quantize_onnx_model(
        onnx_import_file=MODEL, calib_dataloader=SAMPLES, calib_steps=16, setting=QS,
        input_shape=INPUT_SHAPE, collate_fn=lambda x: x.to(EXECUTING_DEVICE),
        platform=QUANT_PLATFROM, do_quantize=True)
    reports = graphwise_error_analyse(
        graph=qir, running_device=EXECUTING_DEVICE, steps=8, dataloader=SAMPLES,
        collate_fn=lambda x: x.to(EXECUTING_DEVICE), method='noise_ratio', verbose=False)
    noisy = [op for op, snr in reports.items() if snr > 0.1]
    layerwise = layerwise_error_analyse(
        graph=qir, running_device=EXECUTING_DEVICE, interested_outputs=None, dataloader=SAMPLES,
        collate_fn=lambda x: x.to(EXECUTING_DEVICE), verbose=False)
    export_ppq_graph(graph=qir, platform=QUANT_PLATFROM, graph_save_to=OUTPUT)

int8_input_names  = [name for name, _ in qir.inputs.items()]
int8_output_names = [name for name, _ in qir.outputs.items()]
session = onnxruntime.InferenceSession(OUTPUT, providers=['CPUExecutionProvider'])
results = [session.run([int8_output_names[0]], {int8_input_names[0]: convert_any_to_numpy(sample)})
           for sample in SAMPLES[:4]]
"""


def test_ptq_example_in_the_style_of_ppqs_onnxruntime_and_tensorrt_samples(tmp_path):
    import runpy
    script = tmp_path / "example_ptq.py"
    script.write_text(PTQ_SCRIPT)
    found = runpy.run_path(str(script), init_globals={"MODEL": small_model(tmp_path / "model.onnx"),
                                                       "OUTPUT": str(tmp_path / "model_int8.onnx")})
    from ppqlike import NumpyExecutor, TargetPlatform
    qir, reports, layerwise = found["qir"], found["reports"], found["layerwise"]
    assert found["QUANT_PLATFROM"] is TargetPlatform.ORT_INT8 and qir.metadata["quantization"]["platform"] == "ORT_INT8"
    assert qir.operations["fc"].config is None and qir.operations["fc"].platform.name == "FP32"  # pinned
    configs = [c for op in qir.operations.values() if op.config for c in op.config.all_configs()]
    assert any(c.observer_algorithm == "percentile" for c in configs)
    assert set(reports) >= {"conv1", "conv2"} and all(0 <= v < 1 for v in reports.values())
    assert reports.method == "noise_ratio" and found["noisy"] == [op for op, v in reports.items() if v > 0.1]
    assert np.isclose(reports["conv2"], 10 ** (-reports.stats["conv2"]["snr"] / 10))
    assert set(layerwise) >= {"conv1", "conv2"}
    simulated = NumpyExecutor(qir)(found["SAMPLES"][0])[0]
    # ORT_INT8 simulates onnxruntime's integer kernels; the pinned Gemm runs in float (summation order may differ)
    np.testing.assert_allclose(found["results"][0][0], simulated, rtol=1e-5, atol=1e-6)


@requires_bench
@pytest.mark.real_model
def test_hand_composed_pipeline_in_the_style_of_ppq_lib_on_a_real_model(tmp_path):
    import ppqlike.lib as PFL
    from ppqlike import TargetPlatform, TorchExecutor, graphwise_error_analyse, load_onnx_graph
    from ppqlike.quantization.optim import (ParameterBakingPass, ParameterQuantizePass,
                                            PassiveParameterQuantizePass, QuantAlignmentPass,
                                            QuantizeFusionPass, QuantizeSimplifyPass, RuntimeCalibrationPass)

    images, _, _ = load_images("mobilenetv2", "calib", 8)
    dataset = [images[i:i + 2] for i in range(0, 8, 2)]
    collate_fn = lambda x: x.to("cpu")  # noqa: E731 - PPQ's habit
    graph = load_onnx_graph(str(PRESETS["mobilenetv2"].path))

    quantizer = PFL.Quantizer(platform=TargetPlatform.TRT_INT8, graph=graph)
    dispatching = PFL.Dispatcher(graph=graph).dispatch(quant_types=quantizer.quant_operation_types)
    last_conv = [op.name for op in graph.operations.values() if op.type == "Conv"][-1]
    dispatching[last_conv] = TargetPlatform.FP32
    for op in graph.operations.values():
        quantizer.quantize_operation(op_name=op.name, platform=dispatching[op.name])
    executor = TorchExecutor(graph=graph, device="cuda")
    executor.tracing_operation_meta(inputs=dataset[0])
    executor.load_graph(graph=graph)
    pipeline = PFL.Pipeline([
        QuantizeSimplifyPass(),
        QuantizeFusionPass(activation_type=quantizer.activation_fusion_types),
        ParameterQuantizePass(),
        RuntimeCalibrationPass(method="kl"),
        QuantAlignmentPass(elementwise_alignment="Align to Output"),
        PassiveParameterQuantizePass(clip_visiblity=True),
        ParameterBakingPass()])
    pipeline.optimize(graph=graph, dataloader=dataset, verbose=False, calib_steps=4, collate_fn=collate_fn,
                      executor=executor)
    analysis = graphwise_error_analyse(graph=graph, running_device="cuda", dataloader=dataset[:1],
                                       collate_fn=collate_fn, verbose=False)
    exported = PFL.Exporter(platform=TargetPlatform.TRT_INT8).export(file_path=str(tmp_path / "q.onnx"),
                                                                      graph=graph)
    # --- checks: the hand-made pipeline quantized the model as asked and its export runs in onnxruntime ---
    assert graph.operations[last_conv].config is None
    convs = [op for op in graph.operations.values() if op.type == "Conv" and op.name != last_conv]
    assert all(op.config is not None and op.platform is TargetPlatform.TRT_INT8 for op in convs)
    activation = convs[0].config.output_quantization_config[0]
    assert activation.observer_algorithm == "kl" and activation.scale is not None
    assert np.median(list(analysis.values())) > 10  # dB: a sound quantization, not noise
    dev, _, _ = load_images("mobilenetv2", "dev", 8)
    float_logits = run(str(PRESETS["mobilenetv2"].path), dev)
    # the QDQ semantics (onnxruntime unoptimized: fused int8 kernels saturate on x86 CPUs without VNNI)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(exported[0], options, providers=["CPUExecutionProvider"])
    quantized_logits = session.run(None, {session.get_inputs()[0].name: dev})[0]
    simulated = TorchExecutor(graph)(dev)[0]
    assert np.mean(simulated.argmax(1) == quantized_logits.argmax(1)) == 1.0
    assert np.mean(quantized_logits.argmax(1) == float_logits.argmax(1)) >= 0.6


def test_ppq_platforms_map_to_their_policy_or_name_the_closest():
    from ppqlike import TargetPlatform
    from ppqlike.core.errors import PlatformError
    assert TargetPlatform.ONNXRUNTIME is TargetPlatform.ORT_INT8
    assert TargetPlatform.SNPE_INT8 is TargetPlatform.DSP_INT8 is TargetPlatform.PPL_DSP_INT8
    assert TargetPlatform.FPGA_INT8 is TargetPlatform.NXP_INT8 and TargetPlatform.NCNN_INT8 is TargetPlatform.TRT_INT8
    assert TargetPlatform.TRT_FP8.is_quantized   # FP8 platforms are implemented (issue 36)
    for unsupported, closest in ((TargetPlatform.PPL_CUDA_FP16, "PPL_CUDA_INT8"),
                                 (TargetPlatform.TENGINE_INT8, "TRT_INT8")):
        assert not unsupported.is_quantized
        with pytest.raises(PlatformError, match=f"closest ppqlike platform is {closest}"):
            TargetPlatform.parse(unsupported)
    import ppqlike
    with pytest.raises(PlatformError, match="TENGINE_INT8"):
        ppqlike.quantize_onnx_model(make_model([], [], []), [], platform=TargetPlatform.TENGINE_INT8)


def test_nested_setting_views_write_the_flat_fields():
    from ppqlike import QuantizationSetting, QuantizationSettingFactory, TargetPlatform
    QS = QuantizationSettingFactory.default_setting()
    QS.equalization_setting.iterations = 3
    QS.quantize_activation_setting.calib_algorithm = "mse"
    QS.bias_correct = True
    QS.bias_correct_setting.steps = 2
    QS.dispatching_table.append(operation="conv9", platform=TargetPlatform.FP32)
    QS.dispatching_table.append(operation="conv3", platform=TargetPlatform.UNSPECIFIED)
    assert (QS.equalization_iterations, QS.activation_observer, QS.bias_correction, QS.bias_correction_steps) == \
        (3, "mse", True, 2)
    assert QS.dispatching_table == {"conv9": "FP32", "conv3": "TARGET"}
    assert QuantizationSetting.from_dict(QS.to_dict()) == QS  # the views leave a plain, saveable setting
    from ppqlike.core.errors import PlatformError
    with pytest.raises(PlatformError, match="isotone"):
        QS.quantize_activation_setting.calib_algorithm = "isotone"
    with pytest.raises(AttributeError, match="equalization_setting has no attribute 'iteration'"):
        QS.equalization_setting.iteration = 3


def test_lsq_pass_names_its_closest():
    from ppqlike.core.errors import PlatformError
    from ppqlike.quantization.optim import LearnedStepSizePass
    with pytest.raises(PlatformError, match="AdaRoundPass"):
        LearnedStepSizePass(steps=10)
