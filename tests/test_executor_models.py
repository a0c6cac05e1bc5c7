"""The executor on the shared real models agrees with onnxruntime on real images (issue: foundation)."""

import numpy as np
import onnxruntime
import pytest

import ppqlike
from shared_bench import MODEL_NAMES, PRESETS, load_images, requires_bench

pytestmark = [requires_bench, pytest.mark.real_model]


class _Recorder(ppqlike.OperationHook):
    """A hook that only watches: it switches the executor to its unfused path."""

    def __init__(self):
        self.seen = 0

    def after_operation(self, operation, inputs, outputs):
        self.seen += 1


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_model_matches_onnxruntime(model):
    preset = PRESETS[model]
    images, _, _ = load_images(model, "dev", limit=8)
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(preset.path), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, {preset.input_name: images})[0]
    graph = ppqlike.load_onnx_graph(preset.path)
    executor = ppqlike.NumpyExecutor(graph)
    fused = executor.forward(images)[0]
    recorder = _Recorder()
    unfused = executor.forward({preset.input_name: images}, hooks=[recorder])[0]
    scale = np.abs(expected).max()
    np.testing.assert_allclose(fused, expected, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_array_equal(fused, unfused)  # in-place activation fusion changes nothing
    assert recorder.seen == len(graph.operations)
    assert np.array_equal(fused.argmax(1), expected.argmax(1))
