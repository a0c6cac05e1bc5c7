"""Calibration on Ray: local vs 1 and 2 Ray workers, time, peak memory per process, identical scales.

    python bench/calibration_scaling.py                      # MobileNetV2, 200 calibration images, batch 16
    python bench/calibration_scaling.py --model efficientnet_lite0 --images 64 --platform TRT_INT8

Each configuration runs in a child process of its own (its peak RSS is its own, measured by the OS); Ray
configurations start a local cluster with that many CPUs.  The table gives the calibration pass's time, the
whole quantization's time, the driver's and each worker's peak RSS, and whether the exported config JSON
(every scale, bit for bit) equals the local run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))


def child(model: str, images: int, batch: int, platform: str, backend: str, workers: int) -> dict:
    import warnings
    warnings.simplefilter("ignore")
    import presets
    import ppqlike
    from ppqlike.export.config_json import config_to_json
    data, _, _ = presets.load_images(model, "calib", images)
    batches = [data[i:i + batch] for i in range(0, len(data), batch)]
    setting = ppqlike.QuantizationSettingFactory.for_platform(platform)
    setting.calibration_backend, setting.calibration_workers = backend, workers
    started = time.perf_counter()
    graph = ppqlike.quantize_onnx_model(str(presets.PRESETS[model].path), batches, platform=platform, setting=setting)
    seconds = time.perf_counter() - started
    calibration = next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == "calibration")
    document = config_to_json(graph)
    digest = hashlib.sha256(json.dumps([document["configs"], document["parameters"]], sort_keys=True)
                            .encode()).hexdigest()
    return {"backend": backend, "workers": workers if backend == "ray" else 1, "seconds": round(seconds, 2),
            "calibration_seconds": round(calibration["seconds"], 2),
            "driver_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "worker_peak_mib": calibration["report"].get("worker_peak_mib", []),
            "worker_seconds": calibration["report"].get("worker_seconds", []), "configs_sha256": digest}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--platform", default="TPU_INT8", help="TPU_INT8 calibrates with KL (merged histograms)")
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.images, args.batch, args.platform, args.child[0],
                               int(args.child[1]))))
        return 0
    rows = []
    for backend, workers in (("local", 1), ("ray", 1), ("ray", 2)):
        command = [sys.executable, __file__, "--model", args.model, "--images", str(args.images), "--batch",
                   str(args.batch), "--platform", args.platform, "--child", backend, str(workers)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    local = rows[0]["configs_sha256"]
    print(f"{args.model}, {args.platform}, {args.images} calibration images in batches of {args.batch}\n")
    print("| backend | workers | calibration s | quantization s | driver peak MiB | worker peak MiB | same scales |")
    print("|---|--:|--:|--:|--:|--:|---|")
    for row in rows:
        workers = ", ".join(f"{m:.0f}" for m in row["worker_peak_mib"]) or "-"
        print(f"| {row['backend']} | {row['workers']} | {row['calibration_seconds']:.1f} | {row['seconds']:.1f} | "
              f"{row['driver_peak_mib']:.0f} | {workers} | {'yes' if row['configs_sha256'] == local else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
