"""The recipes section of docs/BENCHMARKS.md: every recipe of ORT_INT8, TRT_INT8 and TPU_INT8 beside
onnxruntime's quantize_static and the peer quantizers (NNCF, ModelOpt, Quark) in one table over the models,
issue 13's goals read against it, and each recipe row beside the best peer row of its class (issue 33)."""

from __future__ import annotations

import peers

RECIPE_PLATFORMS = ("ORT_INT8", "TRT_INT8", "TPU_INT8")
RECIPES = (("plain", "recipe:plain"), ("balanced", "default"), ("best", "recipe:best"))
TARGET_PLATFORMS = ("ORT_INT8", "TRT_INT8")          # accuracy-target rows
ORT_ROWS = (("MinMax per-channel", "ort:MinMax:per_channel"), ("Entropy per-channel", "ort:Entropy:per_channel"),
            ("Percentile per-channel", "ort:Percentile:per_channel"), ("MinMax per-tensor", "ort:MinMax:per_tensor"))
PEER_ROWS = tuple((variant.label, variant.key) for variant in peers.PEER_VARIANTS)
# issue 33: a ppqlike platform's rows are compared with the peers that quantize activations the same way
ASYMMETRIC_PLATFORMS = ("ORT_INT8", "DSP_INT8")                 # unsigned / asymmetric activations
SYMMETRIC_PLATFORMS = ("TRT_INT8", "TPU_INT8", "PPL_CUDA_INT8")  # signed symmetric int8
PEER_CLASSES = {
    "asymmetric": tuple(v.key for v in peers.PEER_VARIANTS if v.activation_class == "asymmetric")
    + tuple(key for _, key in ORT_ROWS[:3]),     # onnxruntime's quantize_static: asymmetric int8 activations
    "symmetric": tuple(v.key for v in peers.PEER_VARIANTS if v.activation_class == "symmetric"),
}
EFFICIENTNET = "efficientnet_lite0"
BALANCED_FLOOR = 0.98            # balanced's agreement on EfficientNet-Lite0
BEST_AGREEMENT = 0.99            # best's agreement, ORT_INT8 and TRT_INT8
BEST_SECONDS = 300.0
TARGET_COSINE = 0.99


def _accuracy(model: dict, key: str) -> dict | None:
    row = model["rows"].get(key)
    return row.get("accuracy") if row else None


def _cell(model: dict, key: str) -> str:
    row = model["rows"].get(key)
    if row is None:
        return "–"
    if "unavailable" in row:
        return "unavailable"
    if "accuracy" not in row:
        return "failed"
    a, q = row["accuracy"], row["quantization"]
    text = (f"{a['agreement']:.3f} / {a['snr_db']:.1f} dB / {a['cosine']:.4f} / {q['wall_seconds']:.1f} s / "
            f"{q['peak_rss_mb']:.0f} MB")
    child = q.get("child") or {}
    if "+mixed_precision" in key:
        int16, fp32 = len(child.get("int16_ops") or []), len(child.get("fp32_ops") or [])
        text += f" / moved {int16} INT16, {fp32} FP32" if int16 else f" / moved {fp32} FP32"
    return text


def _rows() -> list[tuple[str, str]]:
    rows = [(f"{platform} {name}", f"ppqlike:{platform}:{suffix}")
            for platform in RECIPE_PLATFORMS for name, suffix in RECIPES]
    rows += [(f"onnxruntime {label}", key) for label, key in ORT_ROWS]
    rows += list(PEER_ROWS)
    rows += [(f"{platform} balanced + accuracy target {TARGET_COSINE}", f"ppqlike:{platform}:default+mixed_precision")
             for platform in TARGET_PLATFORMS]
    return rows


def has_recipe_rows(results: dict) -> bool:
    return any(key in model["rows"] for model in results["models"] for _, key in _rows())


def recipe_section(results: dict) -> list[str]:
    """The table (a row per recipe or onnxruntime method, a column per model) and the goals."""
    models = results["models"]
    lines = ["## Recipes beside onnxruntime's quantizer", "",
             "Each cell: top-1 agreement with FP32 / SNR of the outputs against FP32 / mean output cosine / wall "
             "time of the quantizing process / its peak RSS (the accuracy-target rows also: the ops moved off 8 "
             "bits). `balanced` is every preset's default recipe (its bias correction on 16 samples, kept where "
             "held-aside outputs gain); `best` = balanced + learned rounding (AdaRound) + activation-range search "
             "at the readers with quantized inputs, bias correction on every calibration sample, within its 240 s "
             "budget; the accuracy-target rows ask an output cosine of "
             f"{TARGET_COSINE} on held-aside calibration batches (ORT_INT8 moves layers to int16, TRT_INT8 to "
             "FP32). Recipes were chosen on calibration images (150 calibrate, 50 held aside), never on the dev "
             "images that measure them here.", "",
             "| row | " + " | ".join(m["title"] for m in models) + " |",
             "|---|" + "--:|" * len(models)]
    for label, key in _rows():
        if any(key in m["rows"] for m in models):
            lines.append(f"| {label} | " + " | ".join(_cell(m, key) for m in models) + " |")
    lines += ["", "Issue 13's goals, read against this table:", ""] + goal_lines(models) + [""]
    return lines + peer_comparison(models)


def _platform_class(platform: str) -> str | None:
    if platform in ASYMMETRIC_PLATFORMS:
        return "asymmetric"
    return "symmetric" if platform in SYMMETRIC_PLATFORMS else None


def best_peer(model: dict, activation_class: str) -> tuple[str, dict] | None:
    """The peer row of ``activation_class`` closest to FP32 in this run (agreement, then cosine): (key, accuracy)."""
    measured = [(key, a) for key in PEER_CLASSES[activation_class] if (a := _accuracy(model, key)) is not None]
    return max(measured, key=lambda item: (item[1]["agreement"], item[1]["cosine"])) if measured else None


def _label_of(key: str) -> str:
    return dict((k, label) for label, k in (*PEER_ROWS, *((f"onnxruntime {lb}", k) for lb, k in ORT_ROWS)))[key]


def peer_comparison(models: list[dict]) -> list[str]:
    """Each ppqlike recipe row beside the best peer row of its class (issue 33): a table, empty without peers."""
    if not any(key in m["rows"] for m in models for _, key in PEER_ROWS):
        return []
    lines = ["Each ppqlike recipe row beside the best peer row of its class in this run (closest to FP32: top-1 "
             "agreement, then cosine). Classes: unsigned/asymmetric activations (ORT_INT8, DSP_INT8) against NNCF "
             "MIXED, Quark U8S8 and onnxruntime's per-channel rows; signed symmetric int8 (TRT_INT8, TPU_INT8, "
             "PPL_CUDA_INT8) against ModelOpt, Quark A8W8 and NNCF's default (PERFORMANCE: symmetric, but each "
             "non-negative tensor unsigned: uint8 with zero point 0). Both NNCF rows also quantize each depthwise "
             "Conv's input per channel (its CPU hardware config), which neither onnxruntime's QLinearConv nor "
             "TensorRT runs as an integer kernel. Each cell: ppqlike agreement / cosine vs the "
             "peer's, the peer, and the difference in agreement (negative: ppqlike is behind).", "",
             "| ppqlike row | class | " + " | ".join(m["title"] for m in models) + " |",
             "|---|---|" + "---|" * len(models)]
    for platform in (*ASYMMETRIC_PLATFORMS, *SYMMETRIC_PLATFORMS):
        activation_class = _platform_class(platform)
        for name, suffix in RECIPES:
            key = f"ppqlike:{platform}:{suffix}"
            if not any(key in m["rows"] for m in models):
                continue
            cells = []
            for model in models:
                mine, peer = _accuracy(model, key), best_peer(model, activation_class)
                if mine is None or peer is None:
                    cells.append("–")
                    continue
                theirs = peer[1]
                cells.append(f"{mine['agreement']:.3f} / {mine['cosine']:.4f} vs {theirs['agreement']:.3f} / "
                             f"{theirs['cosine']:.4f} {_label_of(peer[0])} "
                             f"({mine['agreement'] - theirs['agreement']:+.3f})")
            lines.append(f"| {platform} {name} | {activation_class} | " + " | ".join(cells) + " |")
    return lines + [""]


def _best_ort(model: dict) -> tuple[str, float] | None:
    """onnxruntime's best per-channel row of this run: (label, agreement)."""
    measured = [(label, a["agreement"]) for label, key in ORT_ROWS[:3]
                if (a := _accuracy(model, key)) is not None]
    return max(measured, key=lambda item: item[1]) if measured else None


def goal_lines(models: list[dict]) -> list[str]:
    """One bullet per goal: met or missed, cell by cell."""
    balanced, best, target = [], [], []
    for model in models:
        title, reference = model["title"], _best_ort(model)
        for platform in RECIPE_PLATFORMS:
            a = _accuracy(model, f"ppqlike:{platform}:default")
            if a is not None and reference is not None:
                floor = max(reference[1], BALANCED_FLOOR if model["model"] == EFFICIENTNET else 0.0)
                verdict = "met" if a["agreement"] >= floor else f"missed by {floor - a['agreement']:.3f}"
                balanced.append(f"{title} {platform} {a['agreement']:.3f} vs {reference[0]} {reference[1]:.3f}: "
                                f"{verdict}")
        for platform in TARGET_PLATFORMS:
            key = f"ppqlike:{platform}:recipe:best"
            a = _accuracy(model, key)
            if a is not None:
                seconds = model["rows"][key]["quantization"]["wall_seconds"]
                verdict = "met" if a["agreement"] >= BEST_AGREEMENT and seconds <= BEST_SECONDS else "missed"
                best.append(f"{title} {platform} {a['agreement']:.3f} in {seconds:.0f} s: {verdict}")
            key = f"ppqlike:{platform}:default+mixed_precision"
            a = _accuracy(model, key)
            if a is not None:
                verdict = "met" if a["cosine"] >= TARGET_COSINE else "missed"
                target.append(f"{title} {platform} {a['cosine']:.4f} ({_cell(model, key).split(' / ')[-1]}): "
                              f"{verdict}")
    lines = []
    if balanced:
        lines.append("- balanced >= onnxruntime's best per-channel row of this run (and >= "
                     f"{BALANCED_FLOOR} on EfficientNet-Lite0): " + "; ".join(balanced) + ".")
    if best:
        lines.append(f"- best >= {BEST_AGREEMENT} agreement within {BEST_SECONDS:.0f} s: " + "; ".join(best) + ".")
    if target:
        lines.append(f"- accuracy target: output cosine >= {TARGET_COSINE} on the dev images: " + "; ".join(target)
                     + ".")
    return lines
