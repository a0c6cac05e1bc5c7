"""The float platforms (FP8, FP16, BF16, TPU-MLIR's BF16 mode) on the shared real models: quantized on a few
calibration images, exported, and run by onnxruntime (graph optimizations off: onnxruntime 1.32's optimizer
changes the values of float8 QDQ models) equal to the simulation up to float noise: run op by op on the values
onnxruntime fed it, each quantized output is the same bit for bit but where the op's float result (a convolution
summed in another order) lands on the other side of a rounding boundary of the format (>= 99% of every output,
>= 99.9% of all); end to end those steps travel to the logits.  Skipped without ../shared/bench."""

from __future__ import annotations

import pytest

from ppqlike import api
from ppqlike.export.verify import verify_export
from ppqlike.optim.setting import QuantizationSettingFactory
from shared_bench import PRESETS, load_images, requires_bench

pytestmark = [pytest.mark.real_model, requires_bench]


@pytest.mark.parametrize("model,platform", [("mobilenetv2", "TRT_FP8"), ("efficientnet_lite0", "FP8"),
                                            ("squeezenet1.1", "GRAPHCORE_FP8"), ("squeezenet1.1", "BF16"),
                                            ("efficientnet_lite0", "FP16"), ("mobilenetv2", "TPU_BF16")])
def test_real_float_export_equals_simulation(model, platform):
    images, _, _ = load_images(model, "calib", 8)
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.protection = False   # the export of the formats is checked here: every layer stays in its format (the
    # protection may move whole fronts to FP32: SqueezeNet GRAPHCORE_FP8 on 8 images, 33 of its 35 units)
    graph = api.quantize_onnx_model(str(PRESETS[model].path), [images[:4], images[4:]], platform=platform,
                                    setting=setting)
    test, _, _ = load_images(model, "dev", 4)
    result = verify_export(graph, test, optimizations=("disable",), per_operation_inputs=test[:2])
    assert result["per_operation"]["quantized_outputs"] > 0
    per_operation = result["per_operation"]
    assert per_operation["min_exact"] >= 0.99 and per_operation["mean_exact"] >= 0.999, per_operation
    for name, stats in result["end_to_end"]["disable"].items():
        assert stats["top1_agreement"] >= 0.75 and stats["cosine"] >= 0.98, (name, stats)
