"""A residual Add run with its quantizations block by block (``executor.quantized_sum``) gives the bytes of
the ops run one by one (a hook turns the fusion off), on platforms that quantize an Add's inputs and output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ppqlike import api
from ppqlike.executor import NumpyExecutor, OperationHook


def _residual_model() -> onnx.ModelProto:
    """Two 1x1 Convs, a residual Add of their results (two activations of one shape), a 1x1 Conv after it."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="first"),
             helper.make_node("Conv", ["a", "w2"], ["b"], name="second"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w3"], ["y"], name="after")]
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3, name)
               for name in ("w1", "w2", "w3")]
    graph = helper.make_graph(nodes, "residual",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 128, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 128, 128])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("platform", ["NXP_INT8", "PPL_CUDA_INT8", "ACADEMIC_INT8"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_quantized_sum_gives_the_bytes_of_the_ops_one_by_one(platform, channels_last, tmp_path, monkeypatch):
    from ppqlike.executor import executor as executor_module
    path = tmp_path / "residual.onnx"
    onnx.save(_residual_model(), path)
    rng = np.random.default_rng(4)
    graph = api.quantize_onnx_model(str(path), [rng.standard_normal((3, 8, 128, 128)).astype(np.float32)],
                                    platform=platform)
    fused = []
    original = executor_module.quantized_sum
    monkeypatch.setattr(executor_module, "quantized_sum", lambda *a: fused.append(original(*a)) or fused[-1])
    x = rng.standard_normal((3, 8, 128, 128)).astype(np.float32)
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = NumpyExecutor(graph).forward(x)[0]
    assert len(fused) == 1 and fused[0] is not None   # the Add ran fused
    want = NumpyExecutor(graph).forward(x, hooks=[OperationHook()])[0]
    assert got.tobytes() == want.tobytes()
