"""TPU_INT8 with an accuracy target: layers moved to BF16 first (now) against FP32 only (before issue 36).

    python3 bench/tpu_bf16.py --model mobilenetv2 --target 0.995 --calib 32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import presets  # noqa: E402


def run(model: str, target: float, calib: int, bf16: bool) -> dict:
    from ppqlike import api
    from ppqlike.optim import recipe
    from ppqlike.optim.setting import QuantizationSettingFactory
    original = recipe.get_platform_policy
    if not bf16:   # the policy as it was: FP32 the only higher precision
        recipe.get_platform_policy = lambda p: original(p).with_changes(higher_precision_bits=None)
    try:
        images, _, _ = presets.load_images(model, "calib", calib)
        setting = QuantizationSettingFactory.for_platform("TPU_INT8")
        setting.accuracy_target = target
        graph = api.quantize_onnx_model(str(presets.PRESETS[model].path), [images[i:i + 8] for i in range(0, calib, 8)],
                                        platform="TPU_INT8", setting=setting)
    finally:
        recipe.get_platform_policy = original
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "mixed_precision")
    return {"model": model, "target": target, "higher_precision": report["higher_precision"],
            "initial_cosine": report["initial_cosine"], "final_cosine": report["final_cosine"],
            "reached": report["reached"], "fp32_ops": len(report["moved"]["FP32"]),
            "bf16_ops": len(report["moved"].get("BF16", [])), "seconds": report["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--target", type=float, default=0.995)
    parser.add_argument("--calib", type=int, default=32)
    args = parser.parse_args()
    for bf16 in (False, True):
        print(json.dumps(run(args.model, args.target, args.calib, bf16)), flush=True)


if __name__ == "__main__":
    main()
