"""Imported quantized models: ppqlike's simulation against onnxruntime's run of the same file.

    python bench/import_quantized.py                       # the three shared models, 32 calib / 32 dev images
    python bench/import_quantized.py --models mobilenetv2 --dev-images 8 --analyse mobilenetv2

For each model, onnxruntime's quantize_static writes QDQ and QOperator files (uint8 and int8 activations,
per-tensor and per-channel int8 weights, 7-bit weights as onnxruntime advises for x86 CPUs without VNNI);
ppqlike imports each file and its simulation runs on the dev images next to onnxruntime's run of the file.
The table gives the fraction of output values that are equal bit for bit, the top-1 agreement, how many ops
onnxruntime runs as integer kernels and the import time.  ``--analyse`` adds the graph-wise error table of
one imported model against its FP32 graph (where the file's quantization loses signal).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

#: (format, activation type, per channel)
VARIANTS = [("QDQ", "QUInt8", False), ("QDQ", "QUInt8", True), ("QDQ", "QInt8", False), ("QDQ", "QInt8", True),
            ("QOperator", "QUInt8", False), ("QOperator", "QUInt8", True)]


def run_file(path: str, images: np.ndarray) -> np.ndarray:
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: images[i:i + 8]})[0] for i in range(0, len(images), 8)])


def main(argv=None) -> int:
    import logging
    import presets
    import ppqlike
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(presets.MODEL_NAMES))
    parser.add_argument("--calib-images", type=int, default=32)
    parser.add_argument("--dev-images", type=int, default=32)
    parser.add_argument("--full-range-weights", action="store_true",
                        help="8-bit weights (reduce_range=False): onnxruntime saturates on x86 without VNNI")
    parser.add_argument("--analyse", default=None, help="a model whose QDQ uint8 per-channel import is analysed")
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer is talkative
    print("| model | format | activations | weights | equal values | top-1 agree | integer kernels | import s |")
    print("|---|---|---|---|--:|--:|--:|--:|")
    with tempfile.TemporaryDirectory(prefix="ppqlike-import-") as folder:
        analysed = None
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            calibration, _, _ = presets.load_images(model, "calib", args.calib_images)
            dev, _, _ = presets.load_images(model, "dev", args.dev_images)
            for variant in VARIANTS:
                file_format, activations, per_channel = variant
                path = presets.quantize_static_with_onnxruntime(
                    model, os.path.join(folder, f"{model}-{file_format}-{activations}-{per_channel}.onnx"),
                    calibration, file_format, activations, per_channel, not args.full_range_weights)
                started = time.perf_counter()
                graph = ppqlike.import_quantized_onnx(path)
                seconds = time.perf_counter() - started
                facts = graph.metadata["quantization"]["imported"]
                executor = ppqlike.NumpyExecutor(graph)
                simulated = np.concatenate([executor.forward(dev[i:i + 8])[0] for i in range(0, len(dev), 8)])
                expected = run_file(path, dev)
                print(f"| {model} | {variant[0]} | {variant[1][1:].lower()} | "
                      f"{'per-channel' if variant[2] else 'per-tensor'} | {np.mean(simulated == expected):.4f} | "
                      f"{np.mean(simulated.argmax(1) == expected.argmax(1)):.3f} | "
                      f"{facts['runtime_kernels']}/{facts['quantized_ops']} | {seconds:.2f} |", flush=True)
                if model == args.analyse and variant == ("QDQ", "QUInt8", True):
                    analysed = (graph, dev[:8])
        if analysed is not None:
            graph, images = analysed
            analysis = ppqlike.graphwise_error_analyse(graph, [images], verbose=False)
            print(f"\nGraph-wise SNR of the imported {args.analyse} (QDQ uint8, per-channel) on {len(images)} "
                  "dev images, worst 10:\n")
            print(analysis.table(10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
