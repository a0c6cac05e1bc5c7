"""Learned rounding on Ray workers: the adaround pass's time locally and with N workers, and identical results.

    python bench/ray_adaround.py                                  # MobileNetV2, ACADEMIC_W4A8, 32 images
    python bench/ray_adaround.py --model squeezenet1.1 --steps 100 --backends local ray:2

``balanced`` with learned rounding on (``adaround_steps`` default 500, ``adaround_samples`` default 4096) on
``--images`` calibration images in batches of ``--batch``.  Each backend ('local', or 'ray:N') runs in this
process, one after the other (Ray started for each Ray run and shut down after).  Prints per backend the
pass's seconds (and of it, the row capture here), the whole quantization's, the layers rounded, the workers'
seconds per task, and a hash of the configs JSON (baked weights included) and of the outputs on the first
batch (the same for every backend when the results are the same bits).
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
    parser.add_argument("--platform", default="ACADEMIC_W4A8")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="adaround_steps (default: the setting's)")
    parser.add_argument("--backends", nargs="+", default=["local", "ray:1", "ray:2"])
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import numpy as np
    import presets
    import ppqlike
    from ppqlike.export.config_json import config_to_json
    images, _, _ = presets.load_images(args.model, "calib", args.images)
    batches = [images[i:i + args.batch] for i in range(0, len(images), args.batch)]
    for backend in args.backends:
        kind, _, workers = backend.partition(":")
        setting = ppqlike.QuantizationSettingFactory.for_platform(args.platform)
        setting.adaround = True
        if args.steps is not None:
            setting.adaround_steps = args.steps
        setting.calibration_backend, setting.calibration_workers = kind, int(workers or 2)
        started = time.perf_counter()
        graph = ppqlike.quantize_onnx_model(str(presets.PRESETS[args.model].path), batches, platform=args.platform,
                                            setting=setting)
        seconds = time.perf_counter() - started
        record = next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == "adaround")
        report, document = record["report"], config_to_json(graph)
        configs = hashlib.sha256(json.dumps([document["configs"], document["parameters"]],
                                            sort_keys=True).encode()).hexdigest()[:10]
        outputs = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes()
                                          for o in ppqlike.NumpyExecutor(graph).forward(batches[0]))).hexdigest()[:10]
        print(json.dumps({"backend": backend, "pass_s": round(record["seconds"], 2),
                          "capture_s": report["capture_seconds"], "quantization_s": round(seconds, 2),
                          "layers": report["layers"], "improved": report["improved"], "steps": report["steps"],
                          "statistics_mib": round(report["statistics_bytes"] / 2 ** 20, 1),
                          "worker_seconds": report.get("worker_seconds", []), "configs": configs,
                          "outputs": outputs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
