"""The ViT-S saliency benchmark (issue 14): each platform's preset (balanced) and best recipe beside
onnxruntime's quantize_static, W8A8, every exported model run in onnxruntime and compared with the FP32 map.

Every quantization runs in a child process (``bench/run.py --child``, through the launcher of
``bench/matrix.py``), so wall time and peak RSS are the OS's measures of that process alone.  Calibration:
the first ``--calib`` images of the calibration split; measure: the first ``--dev`` dev images.  Printed and
written (``--out``, JSON and Markdown): cosine with the FP32 map per image (mean and worst image), quantization
seconds and peak RSS.

    python bench/vit.py --calib 64 --dev 64 --out /tmp/vit_bench
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import matrix  # noqa: E402
import metrics  # noqa: E402
import presets  # noqa: E402

MODEL = "vit_s_focus"
PLATFORMS = ("ORT_INT8", "TRT_INT8", "TPU_INT8")


def configs(recipes=("balanced", "best")) -> list[matrix.Config]:
    rows = [matrix.Config(f"{platform}:{recipe}", "ppqlike", platform, f"recipe:{recipe}")
            for platform in PLATFORMS for recipe in recipes]
    rows += [matrix.Config(f"ort:MinMax:{per_channel}", "ort", method="MinMax", per_channel=per_channel)
             for per_channel in (False, True)]
    return rows


def cosines(model_path: str, reference: np.ndarray, images: np.ndarray) -> np.ndarray:
    """Per image: cosine between the model's map and the FP32 map."""
    output = metrics.ort_outputs(metrics.ort_session(model_path), images).reshape(len(images), -1)
    reference = reference.reshape(len(images), -1)
    return (output * reference).sum(1) / (np.linalg.norm(output, axis=1) * np.linalg.norm(reference, axis=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calib", type=int, default=64, help="calibration images (default 64)")
    parser.add_argument("--dev", type=int, default=64, help="dev images measured (default 64)")
    parser.add_argument("--recipes", default="balanced,best", help="ppqlike recipes (default balanced,best)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ppqlike_vit_bench"), help="output folder")
    args = parser.parse_args(argv)
    if not presets.HAVE_BENCH:
        sys.exit(f"the shared benchmark folder {presets.BENCH_DIR} is absent")
    args.out.mkdir(parents=True, exist_ok=True)
    images = presets.load_images(MODEL, "dev", args.dev)[0]
    reference = metrics.ort_outputs(metrics.ort_session(str(presets.PRESETS[MODEL].path)), images)
    rows = []
    for config in configs(tuple(args.recipes.split(","))):
        output = args.out / f"{config.key.replace(':', '_')}.onnx"
        spec = matrix.spec_for(config, MODEL, args.calib, 16, output)
        measured = matrix.measure_child(matrix.child_command(spec), args.out / (output.stem + ".log"))
        row = {"config": config.label, "wall_seconds": round(measured["wall_seconds"], 1),
               "peak_rss_mb": round(measured["peak_rss_mb"])}
        if "error" in measured:
            row["error"] = measured["error"]
        else:
            values = cosines(str(output), reference, images)
            row.update(mean_cosine=round(float(values.mean()), 4), worst_cosine=round(float(values.min()), 4),
                       quantize_seconds=round(measured["child"]["quantize_seconds"], 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "vit.json").write_text(json.dumps({"calib": args.calib, "dev": args.dev, "rows": rows}, indent=2))
    lines = ["| configuration | mean cosine | worst image | quantize s | wall s | peak RSS MB |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['config']} | {row.get('mean_cosine', 'error')} | {row.get('worst_cosine', '')} | "
                     f"{row.get('quantize_seconds', '')} | {row['wall_seconds']} | {row['peak_rss_mb']} |")
    (args.out / "vit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
