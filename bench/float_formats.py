"""FP8 / FP16 / BF16 rows (issue 36): each float platform on the shared CNNs and the ViT.

For each model and platform: quantize (the platform's preset setting, ``--calib`` calibration images), run
the simulation on the first ``--dev`` dev images and report top-1 agreement with FP32 (the ViT's saliency
map: agreement of the map's peak), top-1 against the labels (classifiers), the mean per-image output cosine
against FP32, and the exported QDQ model run by onnxruntime (graph optimizations off: onnxruntime 1.32's
optimizer changes float8 QDQ models' values) against the simulation (cosine, top-1 agreement, max |diff|).

    python3 bench/float_formats.py --calib 32 --dev 100 --out /tmp/float_bench
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import presets  # noqa: E402

MODELS = ("efficientnet_lite0", "squeezenet1.1", "mobilenetv2", "vit_s_focus")
PLATFORMS = ("TRT_FP8", "FP8", "GRAPHCORE_FP8", "FP16", "BF16")


def cosine_per_image(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)


def run_batches(function, images: np.ndarray, batch: int = 16) -> np.ndarray:
    return np.concatenate([function(images[i:i + batch]) for i in range(0, len(images), batch)])


def measure(model: str, platform: str, calib: int, dev: int, out: Path) -> dict:
    from ppqlike import api
    from ppqlike.executor import NumpyExecutor
    from ppqlike.executor.simulation import dequantized
    from ppqlike.export.verify import run_qdq_model
    preset = presets.PRESETS[model]
    images, _, _ = presets.load_images(model, "calib", calib)
    test, labels, _ = presets.load_images(model, "dev", dev)
    start = time.perf_counter()
    graph = api.quantize_onnx_model(str(preset.path), [images[i:i + 16] for i in range(0, calib, 16)],
                                    platform=platform)
    seconds = time.perf_counter() - start
    executor = NumpyExecutor(graph)
    simulated = run_batches(lambda x: executor.forward(x)[0], test)
    with dequantized(graph):
        fp32 = run_batches(lambda x: executor.forward(x)[0], test)
    path = out / f"{model}.{platform}.onnx"
    api.export_ppq_graph(graph, platform, str(path))
    import onnx
    exported_model = onnx.load(str(path))
    name = graph.inputs[0].name
    exported = run_batches(lambda x: run_qdq_model(exported_model, {name: x}, optimization="disable")[0], test)
    flat = lambda a: a.reshape(len(a), -1)   # noqa: E731  (the ViT map's peak: argmax over the flattened map)
    row = {"model": model, "platform": platform, "images": int(len(test)), "quantize_s": round(seconds, 1),
           "top1_agreement_fp32": float(np.mean(flat(simulated).argmax(1) == flat(fp32).argmax(1))),
           "cosine_fp32_mean": float(cosine_per_image(simulated, fp32).mean()),
           "cosine_fp32_min": float(cosine_per_image(simulated, fp32).min()),
           "export_vs_simulation_cosine_min": float(cosine_per_image(exported, simulated).min()),
           "export_vs_simulation_top1": float(np.mean(flat(exported).argmax(1) == flat(simulated).argmax(1))),
           "export_vs_simulation_max_abs": float(np.abs(exported - simulated).max())}
    if preset.reference_top1:
        row["top1_fp32"] = float(np.mean(fp32.reshape(len(fp32), -1).argmax(1) == labels))
        row["top1"] = float(np.mean(simulated.reshape(len(simulated), -1).argmax(1) == labels))
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| model | platform | top-1 agreement with FP32 | cosine with FP32 (mean / worst) | top-1 (FP32) | "
             "export vs simulation (worst cosine / top-1 / max abs diff) | quantize s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        top1 = f"{r['top1']:.3f} ({r['top1_fp32']:.3f})" if "top1" in r else "n/a (saliency map)"
        lines.append(f"| {r['model']} | {r['platform']} | {r['top1_agreement_fp32']:.3f} | "
                     f"{r['cosine_fp32_mean']:.5f} / {r['cosine_fp32_min']:.5f} | {top1} | "
                     f"{r['export_vs_simulation_cosine_min']:.7f} / {r['export_vs_simulation_top1']:.3f} / "
                     f"{r['export_vs_simulation_max_abs']:.2e} | {r['quantize_s']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calib", type=int, default=32)
    parser.add_argument("--dev", type=int, default=100)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--platforms", nargs="*", default=list(PLATFORMS))
    parser.add_argument("--out", default="/tmp/float_bench")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models:
        for platform in args.platforms:
            rows.append(measure(model, platform, args.calib, args.dev, out))
            print(json.dumps(rows[-1]), flush=True)
            (out / "rows.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (out / "rows.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
