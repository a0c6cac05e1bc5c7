"""Peak memory and time of calibration, measured by the OS, for growing numbers of images.

    python3 bench/calibration_memory.py --model efficientnet_lite0 --observer kl --images 20 200

Each measurement runs quantize_onnx_model in its own subprocess, with images
decoded lazily batch by batch (so the dataset itself is not what is measured),
and reads that child's own peak RSS from ``os.wait4``.
Streaming observers keep a fixed-size state: the peak should not grow with
the number of images.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))


def child(model: str, platform: str, observer: str, images: int, batch: int) -> None:
    from shared_bench import BENCH_DIR, PRESETS

    from ppqlike.api import quantize_onnx_model
    from ppqlike.io.images import list_images, load_image
    from ppqlike.optim.setting import QuantizationSettingFactory
    import numpy as np

    preset = PRESETS[model]
    folder = BENCH_DIR / "images" / "calib"
    files = [folder / name for name in list_images(folder)][:images]

    class LazyBatches:
        def __len__(self):
            return (len(files) + batch - 1) // batch

        def __iter__(self):
            for start in range(0, len(files), batch):
                yield np.concatenate([load_image(f, **preset.options) for f in files[start:start + batch]])

    setting = QuantizationSettingFactory.for_platform(platform)
    setting.activation_observer = observer
    started = time.perf_counter()
    graph = quantize_onnx_model(str(preset.path), LazyBatches(), platform=platform, setting=setting)
    passes = {p["name"]: p["seconds"] for p in graph.metadata["quantization"]["passes"]}
    print(json.dumps({"seconds": time.perf_counter() - started, "calibration_seconds": passes.get("calibration")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="efficientnet_lite0")
    parser.add_argument("--platform", default="TRT_INT8")
    parser.add_argument("--observer", default="kl")
    parser.add_argument("--images", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.platform, args.observer, args.images[0], args.batch)
        return
    print(f"model {args.model}, platform {args.platform}, observer {args.observer}, batch {args.batch}, "
          f"{os.cpu_count()} cores")
    for count in args.images:
        facts, peak_kb = measure_child([sys.executable, __file__, "--child", "--model", args.model, "--platform",
                                        args.platform, "--observer", args.observer, "--images", str(count),
                                        "--batch", str(args.batch)])
        print(f"{count:5d} images: peak RSS {peak_kb / 1024:7.1f} MB, quantization {facts['seconds']:6.1f} s "
              f"(calibration {facts['calibration_seconds']:.1f} s)")


def measure_child(command: list[str]) -> tuple[dict, int]:
    """Run ``command``; return the JSON of its last output line and its own peak RSS in KB."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        output = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"measurement failed (exit {process.returncode}): {' '.join(command)}")
    return json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss


if __name__ == "__main__":
    main()
