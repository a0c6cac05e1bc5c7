"""The accuracy target on Ray workers: its pass time locally and with N workers, and identical results.

    python bench/ray_accuracy_target.py                                   # MobileNetV2, target 0.9995
    python bench/ray_accuracy_target.py --model squeezenet1.1 --target 0.999 --backends local ray:2

ORT_INT8 ``plain`` on ``--images`` calibration images in batches of 2, the last batch held aside for the
target.  Each backend ('local', or 'ray:N') runs in this process, one after the other (Ray started for each
Ray run and shut down after).  Prints per backend the mixed-precision pass's seconds, the whole
quantization's, the measurements made, the worker tasks, and a hash of the configs JSON and the pass's
trace (the same for every backend when the results are the same bits).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--target", type=float, default=0.9995)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--backends", nargs="+", default=["local", "ray:1", "ray:2"])
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import presets
    import ppqlike
    from ppqlike.export.config_json import config_to_json
    images, _, _ = presets.load_images(args.model, "calib", args.images)
    batches = [images[i:i + 2] for i in range(0, len(images), 2)]
    for backend in args.backends:
        kind, _, workers = backend.partition(":")
        setting = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="plain")
        setting.accuracy_target, setting.mixed_precision_batches = args.target, 1
        setting.calibration_backend, setting.calibration_workers = kind, int(workers or 2)
        started = time.perf_counter()
        graph = ppqlike.quantize_onnx_model(str(presets.PRESETS[args.model].path), batches, platform="ORT_INT8",
                                            setting=setting)
        seconds = time.perf_counter() - started
        record = next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == "mixed_precision")
        report, document = record["report"], config_to_json(graph)
        digest = hashlib.sha256(json.dumps([document["configs"], document["parameters"], report["trace"]],
                                           sort_keys=True).encode()).hexdigest()[:10]
        print(json.dumps({"backend": backend, "pass_s": round(record["seconds"], 2), "quantization_s": round(seconds, 2),
                          "units": report["units"], "measurements": report["measurements"],
                          "trace": len(report["trace"]), "worker_tasks": report.get("worker_tasks", 0),
                          "final_cosine": report["final_cosine"], "hash": digest}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
