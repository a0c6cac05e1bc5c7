"""Same bits whatever the thread count: a real model quantized (balanced recipe) and exported with 1, 2 and 4
kernel threads gives byte-identical JSON configs and QDQ models, and its simulation the same output bits."""

import hashlib

import pytest

from ppqlike import api
from ppqlike.executor import NumpyExecutor, num_threads, set_num_threads

from shared_bench import PRESETS, load_images, requires_bench

pytestmark = [requires_bench, pytest.mark.real_model, pytest.mark.slow]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("model,platform", [("mobilenetv2", "TRT_INT8"), ("efficientnet_lite0", "ORT_INT8"),
                                            ("squeezenet1.1", "TPU_INT8")])
def test_quantization_is_the_same_bits_on_1_2_and_4_threads(model, platform, tmp_path):
    calibration, _, _ = load_images(model, "calib", 16)
    dev, _, _ = load_images(model, "dev", 4)
    seen = {}
    try:
        for threads in (1, 2, 4):
            set_num_threads(threads)
            assert num_threads() == threads
            graph = api.quantize_onnx_model(str(PRESETS[model].path), [calibration[:8], calibration[8:]],
                                            platform=platform)
            paths = api.export_ppq_graph(graph, platform, tmp_path / f"{threads}.onnx", tmp_path / f"{threads}.json")
            output = NumpyExecutor(graph).forward(dev)[0]
            seen[threads] = (_digest(open(paths[1], "rb").read()), _digest(open(paths[0], "rb").read()),
                             _digest(output.tobytes()))
    finally:
        set_num_threads(None)
    assert seen[1] == seen[2] == seen[4], seen
