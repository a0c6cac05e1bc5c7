"""docs/BENCHMARKS.md from the measurements of ``bench/run.py``: environment, one table per model,
the goals each row is read against, and one summary line per model."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import recipe_report

REPO = Path(__file__).resolve().parent.parent
# docs/BENCHMARKS.md keeps everything from this line on when bench/run.py rewrites the file
KEPT_MARKER = "<!-- Sections below are written by the other bench/ scripts; bench/run.py keeps them. -->"

# the goals (read against the table; not timed tests)
AGREEMENT_PER_CHANNEL = 0.99
AGREEMENT_PER_TENSOR = 0.97
KL_MODEL = "efficientnet_lite0"
KL_SECONDS = 10.0
KL_RSS_MB = 1024.0
SPEEDUP = 1.5
SIM_TOP1 = 1.0
W4A8_POINTS = 0.02         # ACADEMIC_W4A8 (with AdaRound): top-1 within 2 points of FP32's
MIXED_PRECISION_COSINE = 0.99


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def source_fingerprint() -> str:
    """sha1 of every ppqlike/*.py file (path and content): tells whether the code changed during a run."""
    import hashlib
    digest = hashlib.sha1()
    for path in sorted((REPO / "ppqlike").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def environment() -> dict:
    """Cores, memory, CPU, load and the versions of every package involved."""
    import importlib.metadata as metadata
    versions = {"python": sys.version.split()[0]}
    for name in ("numpy", "onnx", "onnxruntime", "networkx", "tqdm", "Pillow"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    import ppqlike
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    versions["ppqlike"] = f"{ppqlike.__version__} (git {commit}{', with uncommitted changes' if dirty else ''})"
    return {"cores": os.cpu_count(), "memory_gib": _memory_gib(), "cpu": _cpu_model(),
            "platform": platform.platform(), "versions": versions, "load_start": load_average(),
            "source_start": source_fingerprint()}


# ---------------------------------------------------------------- reading rows

def _get(row: dict, *path, default=None):
    value = row
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def _ok(row: dict) -> bool:
    return "accuracy" in row


def _per_channel(row: dict) -> bool:
    child = _get(row, "quantization", "child") or {}
    return bool(child.get("per_channel", row["config"].get("per_channel")))


def _label(row: dict) -> str:
    return row["config"]["label"]


def _short(row: dict) -> str:
    return _label(row).replace("ppqlike ", "").replace(" (default)", "")


def _passes(row: dict) -> tuple:
    return tuple(row["config"].get("passes") or ())


def _accuracy_goal(model: dict, row: dict) -> tuple[str, str] | None:
    """The accuracy goal ``row`` misses, if any: W4A8 rows against FP32 top-1, mixed-precision rows
    against the output cosine, the others against top-1 agreement."""
    accuracy = row["accuracy"]
    if row["config"].get("platform") == "ACADEMIC_W4A8":
        gap = model["fp32"]["top1"] - accuracy["top1"]
        if gap > W4A8_POINTS:
            return ("W4A8 top-1", f"{accuracy['top1']:.3f} vs FP32 {model['fp32']['top1']:.3f} "
                                  f"({100 * gap:.1f} points > {100 * W4A8_POINTS:.0f})")
        return None
    if "mixed_precision" in _passes(row):
        if accuracy["cosine"] < MIXED_PRECISION_COSINE:
            return ("mixed-precision cosine", f"{accuracy['cosine']:.4f} < {MIXED_PRECISION_COSINE} "
                                              f"(-{MIXED_PRECISION_COSINE - accuracy['cosine']:.4f})")
        return None
    agreement = accuracy["agreement"]
    threshold = AGREEMENT_PER_CHANNEL if _per_channel(row) else AGREEMENT_PER_TENSOR
    if agreement < threshold:
        granularity = "per-channel" if _per_channel(row) else "per-tensor"
        return ("agreement", f"{agreement:.3f} < {threshold:.2f} ({granularity}, -{threshold - agreement:.3f})")
    return None


def _float_kernels(row: dict) -> str:
    """'; onnxruntime runs F of N Conv/MatMul/Gemm in float' where it does (measured on its optimized graph)."""
    kernels = row.get("kernels")
    if not kernels or not kernels.get("float"):
        return ""
    total = kernels["float"] + kernels["integer"]
    return f"; onnxruntime runs {kernels['float']} of its {total} Conv/MatMul/Gemm in float"


def goal_misses(model: dict, row: dict) -> list[tuple[str, str]]:
    """(goal, text saying by how much) for every goal ``row`` misses."""
    misses = []
    if not _ok(row):
        return [("runs", "failed: " + str(_get(row, "quantization", "error", default="?"))[:200])]
    accuracy = _accuracy_goal(model, row)
    if accuracy is not None:
        misses.append(accuracy)
    speedup = row["throughput"]["speedup"]
    if speedup < SPEEDUP:
        misses.append(("speed", f"{speedup:.2f}x < {SPEEDUP}x FP32 (-{SPEEDUP - speedup:.2f}x{_float_kernels(row)})"))
    if row["config"]["tool"] == "ppqlike":
        quant = row["quantization"]
        observer = row["config"].get("resolved_observer")
        if model["model"] == KL_MODEL and observer == "kl" and not _passes(row):
            if quant["wall_seconds"] > KL_SECONDS:
                misses.append(("KL time", f"{quant['wall_seconds']:.1f} s > {KL_SECONDS:.0f} s "
                                          f"({quant['wall_seconds'] / KL_SECONDS:.1f}x)"))
            if quant["peak_rss_mb"] > KL_RSS_MB:
                misses.append(("KL memory", f"{quant['peak_rss_mb']:.0f} MiB > {KL_RSS_MB:.0f} MiB"))
        sim = row.get("simulation") or {}
        if "top1_agreement" not in sim:
            misses.append(("sim = deploy", "simulation not measured: " + str(sim.get("error"))[:200]))
        elif sim["top1_agreement"] < SIM_TOP1:
            differ = round((1 - sim["top1_agreement"]) * sim["images"])
            misses.append(("sim = deploy", f"top-1 equal {sim['top1_agreement']:.3f} ({differ} of {sim['images']} "
                                           f"images differ{_float_kernels(row)})"))
    return misses


def best_row(rows: list[dict]) -> dict | None:
    """The row closest to FP32: highest top-1 agreement, then highest SNR."""
    ran = [r for r in rows if _ok(r)]
    return max(ran, key=lambda r: (r["accuracy"]["agreement"], r["accuracy"]["snr_db"])) if ran else None


def _distinct(model: dict) -> list[dict]:
    return [r for r in model["rows"].values() if "same_as" not in r]


def summary_line(model: dict) -> str:
    rows = _distinct(model)
    best = best_row(rows)
    text = f"**{model['title']}** — best row: "
    if best is None:
        return text + "none ran."

    def describe(row):
        a = row["accuracy"]
        return (f"{_label(row)} (agreement {a['agreement']:.3f}, top-1 {a['top1']:.3f}, SNR {a['snr_db']:.1f} dB, "
                f"{row['throughput']['speedup']:.2f}x FP32)")
    text += describe(best)
    ppq = [r for r in rows if r["config"]["tool"] == "ppqlike"]
    if best["config"]["tool"] != "ppqlike" and best_row(ppq) is not None:
        text += f"; best ppqlike row: {describe(best_row(ppq))}"
    by_goal: dict[str, list[str]] = {}
    for row in ppq:
        for goal, how in goal_misses(model, row):
            by_goal.setdefault(goal, []).append(f"{_short(row)} {how}")
    if not ppq:
        return text + "."
    if not by_goal:
        return text + ". ppqlike meets every goal."
    parts = [f"{goal}: " + "; ".join(items) for goal, items in by_goal.items()]
    return text + ". ppqlike goals missed — " + " — ".join(parts) + "."


def _is_accuracy_row(row: dict) -> bool:
    config = row["config"]
    return config["tool"] == "ppqlike" and (bool(config.get("passes")) or config.get("platform") == "ACADEMIC_W4A8"
                                            or config.get("observer") == "search")


def accuracy_pass_lines(model: dict) -> list[str]:
    """One bullet per accuracy-pass row: what it reached against its baseline row, and its goal."""
    lines = []
    rows = model["rows"]
    for key, row in rows.items():
        if not _is_accuracy_row(row) or not _ok(row):
            continue
        config, accuracy = row["config"], row["accuracy"]
        child = _get(row, "quantization", "child") or {}
        baseline = rows.get(f"ppqlike:{config['platform']}:default") if config.get("passes") else None
        text = (f"{_short(row)}: top-1 {accuracy['top1']:.3f} (FP32 {model['fp32']['top1']:.3f}), agreement "
                f"{accuracy['agreement']:.3f}, cosine {accuracy['cosine']:.4f}")
        if baseline is not None and _ok(baseline):
            text += (f"; without the pass(es): top-1 {baseline['accuracy']['top1']:.3f}, agreement "
                     f"{baseline['accuracy']['agreement']:.3f}, cosine {baseline['accuracy']['cosine']:.4f}")
        seconds = {k: v for k, v in (child.get("passes") or {}).items()
                   if k in (*config.get("passes", ()), "calibration")}
        text += "; pass time " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        if "mixed_precision" in config.get("passes", ()):
            moved = child.get("fp32_ops") or []
            total = (child.get("target_ops") or 0) + len(moved)
            text += f"; {len(moved)} of {total} ops moved to FP32" + (f" ({', '.join(moved)})" if moved else "")
        goal = _accuracy_goal(model, row)
        text += "; goal " + ("met" if goal is None else f"missed ({goal[0]}: {goal[1]})")
        lines.append(f"- {text}.")
    return (["Accuracy passes (each against the same platform's default row):", ""] + lines + [""]) if lines else []


# ---------------------------------------------------------------- formatting

def _f(value, digits=3, suffix=""):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}{suffix}"


def _activation(row: dict) -> str:
    child = _get(row, "quantization", "child") or {}
    text = child.get("activation", "")
    short = {"asymmetric uint8": "u8 asym", "symmetric int8": "s8 sym", "symmetric uint8": "u8 sym",
             "asymmetric int8": "s8 asym", "asymmetric int8 (QInt8)": "s8 asym",
             "uint8 [0, max] (zero point 0)": "u8 [0,max]"}
    if text.startswith("mixed: "):   # a peer's model with several kinds (bench/peers.py: qdq_summary)
        return " + ".join(f"{part.split(' ', 1)[0]} {short.get(part.split(' ', 1)[1], part.split(' ', 1)[1])}"
                          for part in text[len("mixed: "):].split(", "))
    return short.get(text, text or "–")


def _kernel_counts(row: dict) -> str:
    kernels = row.get("kernels")
    return f"{kernels['integer']}/{kernels['float']}" if kernels else "–"


def _sim_top1(sim: dict) -> str:
    """Equal top-1 fraction; where some differ, how many of those are near ties (the deployed
    top-1 class within one step of the simulation's best)."""
    if "top1_agreement" not in sim:
        return "–" if not sim.get("error") else "failed"
    text = f"{sim['top1_agreement']:.3f}"
    ties = sim.get("top1_agreement_near_ties")
    if ties is not None and sim["top1_agreement"] < 1.0:
        text += f" ({ties:.3f} incl. ties)"
    return text


def model_table(model: dict) -> list[str]:
    fp32 = model["fp32"]
    rates = [r["throughput"]["reference_images_per_second"] for r in _distinct(model) if _ok(r)]
    fp32_rate = statistics.median(rates) if rates else None
    lines = [f"## {model['title']}", "",
             f"FP32 (onnxruntime): top-1 {fp32['top1']:.3f}, top-5 {fp32['top5']:.3f} on {fp32['images']} dev images "
             f"(README: top-1 {model['reference_top1'].get('dev', '?')} on all 300)"
             + (f"; {fp32_rate:.0f} images/s at batch 16, 2 threads (median over the rows)." if fp32_rate else "."),
             "",
             "| row | weights | act. | top-1 | top-5 | agree FP32 | SNR dB | cosine | quant. s | peak MiB "
             "| speed ×FP32 | int/float kernels | sim top-1 = | sim ≤1 step | sim max Δ (steps) |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in model["rows"].values():
        label = _label(row)
        if "same_as" in row:
            lines.append(f"| {label} | ≡ the default row above (the preset's observer is already "
                         f"{row['config'].get('resolved_observer')}): run once | | | | | | | | | | | | | |")
            continue
        if "unavailable" in row:
            lines.append(f"| {label} | | | unavailable: {row['unavailable'][:160]} | | | | | | | | | | | |")
            continue
        if not _ok(row):
            lines.append(f"| {label} | | | failed: {str(_get(row, 'quantization', 'error', default='?'))[:120]} "
                         "| | | | | | | | | | | |")
            continue
        a, q, t = row["accuracy"], row["quantization"], row["throughput"]
        sim = row.get("simulation") or {}
        steps = sim.get("max_steps")
        sim_max = (f"{sim['max_diff']:.3g} ({steps:.1f})" if steps is not None else _f(sim.get("max_diff"), 3)) \
            if "max_diff" in sim else "–"
        lines.append(
            f"| {label} | {'per-channel' if _per_channel(row) else 'per-tensor'} | {_activation(row)} "
            f"| {a['top1']:.3f} | {a['top5']:.3f} | {a['agreement']:.3f} | {_f(a['snr_db'], 1)} | {a['cosine']:.4f} "
            f"| {q['wall_seconds']:.1f} | {q['peak_rss_mb']:.0f} | {t['speedup']:.2f} | {_kernel_counts(row)} "
            f"| {_sim_top1(sim)} | {_f(sim.get('within_one_step'))} | {sim_max} |")
    lines += ["", *_time_breakdown(model), "", *accuracy_pass_lines(model), summary_line(model), ""]
    return lines


def _time_breakdown(model: dict) -> list[str]:
    rows = [r for r in _distinct(model) if "quantization" in r and "child" in r["quantization"]]
    if not rows:
        return []
    lines = ["Where the quantization time goes (seconds, inside the child; JPEG decoding happens during "
             "calibration and is also shown apart; CPU = user + system time of the child, less sensitive "
             "to other load than wall time):", "",
             "| row | wall | CPU | decode | ppqlike passes (calibration first) / ORT pre-process + quantize_static "
             "| export | sim. s (not in wall) |", "|---|--:|--:|--:|---|--:|--:|"]
    for row in rows:
        q, child = row["quantization"], row["quantization"]["child"]
        if row["config"]["tool"] == "ppqlike":
            passes = dict(child.get("passes", {}))
            calibration = passes.pop("calibration", None)
            others = ", ".join(f"{k} {v:.2f}" for k, v in passes.items() if v >= 0.05)
            inner = f"calibration {_f(calibration, 1)}" + (f", {others}" if others else "") \
                + f" (quantize_onnx_model {child['quantize_seconds']:.1f})"
            export = _f(child.get("export_seconds"), 1)
        elif row["config"]["tool"] == "ort":
            inner = f"pre-process {child['preprocess_seconds']:.1f} + quantize_static {child['quantize_seconds']:.1f}"
            export = "(in quantize_static)"
        else:  # a peer: its quantize call, which writes the model (NNCF's returns it, saved apart)
            inner = f"{child.get('call', row['config']['tool']).split('(')[0]} {child['quantize_seconds']:.1f}"
            export = _f(child.get("save_seconds"), 1) if "save_seconds" in child else "(in the call)"
        sim = _f(_get(row, "simulation", "seconds"), 1) if row["config"]["tool"] == "ppqlike" else ""
        lines.append(f"| {_label(row)} | {q['wall_seconds']:.1f} | {q['cpu_seconds']:.1f} "
                     f"| {child.get('decode_seconds', 0):.1f} | {inner} | {export} | {sim} |")
    warnings = sorted({w for r in rows for w in (r["quantization"]["child"].get("warnings") or [])})
    if warnings:
        lines += ["", "Export warnings: " + " / ".join(w[:700] for w in warnings)]
    return lines


def render(results: dict, partial: bool = False) -> str:
    env, options = results["environment"], results["options"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    memory = f"{env['memory_gib']:.1f} GiB" if env.get("memory_gib") else "unknown memory"
    lines = ["# Benchmarks: ppqlike and onnxruntime's quantizer on three real models", "",
             "Generated by `bench/run.py`; do not edit by hand." + (" **Partial: the run did not finish.**"
                                                                   if partial else ""), "",
             f"- Command: `{results['command']}`",
             f"- Machine: {env['cores']} cores ({env['cpu']}), {memory}, {env['platform']}; load average "
             f"(1, 5, 15 min) {env['load_start']} at the start, {env.get('load_end', '?')} at the end "
             "(other work on the machine makes wall times and speed ratios noisy).",
             f"- Versions: {versions}; ppqlike sources sha1 {env.get('source_start', '?')}"
             + ("" if env.get("source_end") in (None, env.get("source_start")) else
                f" at the start, **{env['source_end']} at the end: ppqlike changed during the run, the rows mix "
                "versions**") + ".",
             f"- Data: {options['calib_images']} calibration images (`../shared/bench/images/calib`), "
             f"{options['dev_images']} dev images for evaluation only (nothing is tuned on them)"
             + (f"; ppqlike's simulation runs on the first {min(options['sim_images'], options['dev_images'])} of "
                "them (its numpy executor is slow)" if options.get("sim_images") else "")
             + f". Whole run: {results.get('seconds', 0) / 60:.1f} min.",
             *(f"- {note}" for note in results.get("notes", ())), "",
             "## How to read the tables", "",
             "- **agree FP32**: fraction of dev images whose top-1 class equals the FP32 model's. **SNR dB**: "
             "10·log10(Σ fp32² / Σ (quant − fp32)²) over all outputs of all dev images; **cosine**: mean per "
             "image. "
             "SqueezeNet's output is its final Softmax (probabilities), the others' are logits.",
             "- **quant. s / peak MiB**: wall time and peak RSS of the child process that quantizes, measured by "
             "the OS (`os.wait4`): Python start-up, imports, decoding the calibration JPEGs (lazily, batch by "
             f"batch of {options['batch']}), calibration and writing the quantized model. ppqlike: "
             "`quantize_onnx_model` + `export_ppq_graph` (QDQ ONNX + config JSON); onnxruntime: "
             "`quant_pre_process` then `quantize_static` (QDQ format, its default types: **QInt8 activations, "
             "QInt8 weights**, asymmetric activations, symmetric weights; default calibration options, so Entropy "
             "uses 128 bins and Percentile the 99.999th percentile of 2048 bins, symmetric), fed by a "
             "`CalibrationDataReader` that decodes one image per `get_next` (as onnxruntime's examples do; its "
             "Entropy and Percentile collectors fail on batches of unequal size). Children are started through "
             "a bare launcher process, so that the peak RSS is the child's own and not inherited from the "
             "benchmark's parent.",
             "- **speed ×FP32**: throughput of the quantized model over the FP32 model's, both in onnxruntime "
             f"(CPU, intra_op_num_threads=2, all graph optimizations), batch {options['batch']}, "
             f"{options['repetitions']} interleaved pairs of 3-run measurements, median of the pair ratios. "
             "**int/float kernels**: of the model's Conv/MatMul/Gemm, how many onnxruntime runs as integer kernels "
             "(QLinearConv, QLinearMatMul, QGemm) and how many in float (Conv, FusedConv, MatMul, ...) after its "
             "graph optimizations, read from the optimized graph it saves: float ones dequantize their inputs and "
             "cost speed.",
             "- **sim**: ppqlike's own simulation (NumpyExecutor on the graph reloaded from the exported config "
             "JSON) against the exported model in onnxruntime, on the same dev images: fraction of equal top-1, "
             "in brackets, where they differ, counting as equal a deployed top-1 class whose simulated output is "
             "within one step of the simulated best (a near tie); fraction of outputs within one *step* (the "
             "scale of the last quantized tensor before the output, `ppqlike.export.output_steps`; for "
             "SqueezeNet that is the scale of the logits before its FP32 Softmax, so a probability difference "
             "is bound by it loosely); and the largest difference (in steps).",
             "- ppqlike rows use `QuantizationSettingFactory.for_platform`; *default* is the preset's activation "
             "observer, *kl* sets `setting.activation_observer='kl'`. TRT_INT8 and TPU_INT8 already default to KL, "
             "so their kl rows are the default rows (marked ≡, run once). Weights: per-channel symmetric int8 on "
             "TRT/ORT/TPU, per-tensor asymmetric uint8 on DSP.",
             "- Accuracy-pass rows (opt-in through the setting): *+ equalization* (cross-layer equalization), "
             "*+ bias_correction*, *+ adaround* (learned rounding of the 4-bit weights of ACADEMIC_W4A8), "
             f"*+ mixed_precision* (`accuracy_target={MIXED_PRECISION_COSINE}`: the fewest ops moved "
             "to FP32, chosen on calibration data), and *search* (the TPU-MLIR-style threshold search observer). "
             "Their goals: DSP_INT8 (per-tensor) with equalization ≥ 0.97 agreement on EfficientNet-Lite0; "
             f"ACADEMIC_W4A8 with AdaRound within {100 * W4A8_POINTS:.0f} points of FP32 top-1; mixed precision an "
             f"output cosine ≥ {MIXED_PRECISION_COSINE} on the dev images.",
             "- ORT_INT8's simulation computes onnxruntime's integer kernels (QLinearConv, QLinearMatMul, QGemm, "
             "QLinearAdd, QLinearGlobalAveragePool: exact int32 accumulator, float32 requantization), so its "
             "outputs equal the deployed model's bit for bit; the other platforms simulate their own hardware "
             "and are compared with onnxruntime's float QDQ arithmetic.",
             f"- Goals: agreement ≥ {AGREEMENT_PER_CHANNEL} per-channel and ≥ {AGREEMENT_PER_TENSOR} per-tensor; "
             f"KL on EfficientNet-Lite0 ≤ {KL_SECONDS:.0f} s and ≤ 1 GiB; ≥ {SPEEDUP}x FP32 throughput; "
             "simulation "
             "and deployment agree on every top-1. Each summary names the row closest to FP32 (agreement, then "
             "SNR) and the goals ppqlike misses, by how much.", ""]
    if recipe_report.has_recipe_rows(results):
        lines += recipe_report.recipe_section(results)
    for model in results["models"]:
        lines += model_table(model)
    lines += ["## Summary", ""] + [f"- {summary_line(m)}" for m in results["models"]] + [""]
    return "\n".join(lines)


def write(results: dict, path, partial: bool = False) -> None:
    """Write the report to ``path`` whole (through a temporary file); what the existing file holds from
    ``KEPT_MARKER`` on (sections written by the other benchmark scripts) is kept after it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if path.exists():
        existing = path.read_text()
        if KEPT_MARKER in existing:
            kept = "\n" + existing[existing.index(KEPT_MARKER):]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(render(results, partial) + kept)
    os.replace(temporary, path)
