"""Real pretrained models with control flow from public packages (bench/control_flow.py): Silero VAD's
stateful model (the whole network in the branches of an If, nested Ifs, an LSTM) and SLANet's table-structure
recogniser (an attention GRU decoder in a Loop of 501 steps).  The executor against onnxruntime, and each model
quantized for ORT_INT8, TRT_INT8 and TPU_INT8 (the ops inside the bodies quantized), exported and run in
onnxruntime: mean output cosine >= 0.99 against FP32 on held-out inputs.

The files live outside the repository (``python bench/control_flow.py fetch`` puts them in
``../devmodels/control_flow``); each test skips, saying so, when its file is absent.  Small on purpose.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

from shared_bench import bench_script
from onnx_helpers import assert_executor_matches_file, run_onnxruntime
from ppqlike import api
from ppqlike.core.subgraphs import walk


bench = bench_script("control_flow", sibling_imports=True)   # it imports bench/recurrent.py
pytestmark = pytest.mark.real_model
CONTROL = {"silero_vad_if": "If", "slanet": "Loop"}
#: model -> (calibration inputs, held-out inputs).  SLANet takes 8: with fewer than 4 calibration batches nothing
#: is held aside, so the range choice, the protection and the verdict are measured on the calibration inputs
#: themselves, and its greedy 501-step decoder flips a structure token on unseen tables (TPU_INT8 on 3 inputs,
#: held-out output cosines: 0.968 / 0.464 as chosen, 0.985 / 0.956 with min-max ranges; on 8, two held aside:
#: 0.998 / 0.997 over 6 held-out tables, simulated).
SIZES = {"silero_vad_if": (4, 3), "slanet": (8, 2)}


def _require(name: str):
    if not bench.MODELS[name].present:
        pytest.skip(f"{bench.MODELS[name].path} is absent: python bench/control_flow.py fetch")


@pytest.mark.parametrize("name", list(bench.MODELS))
def test_executor_matches_onnxruntime(name):
    _require(name)
    model = onnx.load(bench.MODELS[name].path)
    assert CONTROL[name] in {node.op_type for node in model.graph.node}
    assert_executor_matches_file(model, bench.model_inputs(name, 99), atol_fraction=1e-4)


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8"])
@pytest.mark.parametrize("name", list(bench.MODELS))
def test_quantized_export_runs_close_to_fp32(name, platform, tmp_path):
    _require(name)
    path = str(bench.MODELS[name].path)
    calib, held = SIZES[name]
    graph = api.quantize_onnx_model(path, [bench.model_inputs(name, seed) for seed in range(calib)],
                                    platform=platform)
    inside = [op for owner, op in walk(graph) if owner is not graph and op.type in ("Conv", "MatMul", "Gemm")]
    assert inside and any(op.config is not None for op in inside)   # the bodies' ops are quantized
    exported = tmp_path / f"{name}_{platform}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api.export_ppq_graph(graph, platform, str(exported))
    deployed_model, reference_model = onnx.load(exported), onnx.load(path)
    cosines = []   # [held-out input][output]
    for seed in range(held):
        feed = bench.model_inputs(name, 10_000 + seed)
        got, want = run_onnxruntime(deployed_model, feed), run_onnxruntime(reference_model, feed)
        cosines.append([bench.cosine(a, b) for a, b in zip(got, want)])
    assert np.mean(cosines, axis=0).min() >= 0.99, cosines
