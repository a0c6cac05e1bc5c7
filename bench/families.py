"""The dev set of model families (issue 33): ppqlike beside onnxruntime's quantizer on detectors, audio front
ends, a byte classifier, BERT encoders, OCR and segmentation, each exported model run in onnxruntime on dev
inputs and scored against the FP32 model.

    python3 bench/families.py                                         # every family, balanced, 3 platforms + ORT
    python3 bench/families.py --models minilm,magika --platforms ORT_INT8 --recipe best --json /tmp/f.json
    python3 bench/families.py --no-ort --calib-samples 16 --markdown /tmp/f.md
    python3 bench/families.py --models minilm --peers                 # + NNCF's default and transformer mode

The families are built by ``bench/devset/build.py`` (its own venv; bench/devset/README.md) into ``--devset``
(default ``$PPQLIKE_DEVSET`` or /work/devmodels): ``<name>/model.onnx``, ``calib.npz``, ``dev.npz``,
``manifest.json``.  A family whose files are absent is skipped with a line saying so.

Per family: the FP32 model's outputs on the dev inputs (onnxruntime), then per configuration a child process
(``bench/matrix.py``'s launcher: wall time and peak RSS of that process alone) that quantizes on the first
``--calib-samples`` calibration samples (default: the manifest's ``calib_default``) and exports; a failure is
recorded with its exception and the frame that raised it, and the run goes on.  The exported model runs in
onnxruntime (the fused session, or the unoptimized one where this CPU's fused u8 x s8 kernels saturate, as in
``bench/run.py``).  Scores: per output, the cosine of each dev sample's output with the FP32 one (the table
shows the mean over outputs of the per-sample mean, the worst sample of any output, and the fraction of
samples with a non-finite output, which have no cosine; a second table gives each output of multi-output
models), and the family metric of ``bench/family_metrics.py`` (detection F1 against the FP32 boxes, top-1
agreement, ...).  Printed: the tables; ``--json``: every measurement, with versions and load averages.
``--peers``: NNCF's rows too, quantizing in the peers' venv (``bench/peers.py``, bench/README.md) on the same
calibration samples: ``nncf.quantize`` with its defaults, and with ``model_type=nncf.ModelType.TRANSFORMER``
(the row issue 33 holds BERT-style encoders to; it is NNCF's own advice for transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import family_metrics  # noqa: E402

DEFAULT_DEVSET = Path(os.environ.get("PPQLIKE_DEVSET", "/work/devmodels"))
PLATFORMS = ("ORT_INT8", "TRT_INT8", "TPU_INT8")
ORT_BASELINE = "ort:MinMax:per_channel"


# ---------------------------------------------------------------- the dev set's files

def load_family(folder: Path) -> dict | None:
    """The manifest of ``folder`` with its paths, or None when a file is missing."""
    needed = [folder / n for n in ("manifest.json", "model.onnx", "calib.npz", "dev.npz")]
    if not all(p.is_file() for p in needed):
        return None
    manifest = json.loads((folder / "manifest.json").read_text())
    return {**manifest, "folder": str(folder), "model_path": str(folder / manifest["model"])}


def batches(family: dict, split: str, count: int | None = None, batch: int | None = None) -> list[dict]:
    """The first ``count`` samples of ``split`` as model feeds (input name -> array): ``batch`` samples stacked
    (default the manifest's), or one sample per feed for families whose samples are whole batches."""
    with np.load(Path(family["folder"]) / f"{split}.npz") as data:
        arrays = {name: data[name][:count] for name in family["inputs"]}
    total = len(next(iter(arrays.values())))
    if not family.get("stack", True):
        return [{k: v[i] for k, v in arrays.items()} for i in range(total)]
    size = batch or family.get("batch", 1)
    return [{k: np.ascontiguousarray(v[i:i + size]) for k, v in arrays.items()} for i in range(0, total, size)]


def run_outputs(session, feeds: list[dict], names: list[str], stacked: bool) -> dict:
    """Output name -> [samples, ...] of ``session`` over ``feeds`` (concatenated, or stacked when each feed is
    one sample)."""
    parts = [session.run(names, feed) for feed in feeds]
    join = np.concatenate if stacked else np.stack
    return {name: join([p[i] for p in parts]) for i, name in enumerate(names)}


# ---------------------------------------------------------------- the children

def _error(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "/ppqlike/" in f.filename] or frames
    where = inside[-1]
    return {"error": f"{type(exc).__name__}: {exc}",
            "where": f"{where.filename.split('/ppqlike/')[-1]}:{where.lineno} in {where.name}"}


def _quantize_ppqlike(spec: dict) -> dict:
    import warnings

    from ppqlike.api import export_ppq_graph, quantize_onnx_model
    from ppqlike.optim.setting import QuantizationSettingFactory

    family = spec["family"]
    setting = QuantizationSettingFactory.for_platform(spec["platform"])
    setting.recipe = spec["recipe"]
    calibration = batches(family, "calib", spec["calib_samples"])
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = quantize_onnx_model(family["model_path"], calibration, platform=spec["platform"], setting=setting)
        quantized = time.perf_counter()
        export_ppq_graph(graph, spec["platform"], spec["output"])
    exported = time.perf_counter()
    kinds = [op.platform.name for op in graph.operations.values() if op.platform is not None]
    return {"quantize_seconds": quantized - started, "export_seconds": exported - quantized,
            "target_ops": sum(k not in ("FP32", "SOI") for k in kinds), "fp32_ops": kinds.count("FP32"),
            "warnings": sorted({" ".join(str(w.message).split())[:300] for w in caught})[:10]}


def _quantize_ort(spec: dict) -> dict:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    family = spec["family"]
    samples = batches(family, "calib", spec["calib_samples"], batch=1)
    os.chdir(Path(spec["output"]).parent)   # quant_pre_process leaves temporary files in the working directory
    started = time.perf_counter()
    source, note = spec["output"] + ".pre.onnx", ""
    try:
        quant_pre_process(family["model_path"], source)
    except Exception as exc:  # noqa: BLE001 - the baseline goes on without onnxruntime's pre-processing
        source, note = family["model_path"], f"quant_pre_process failed ({type(exc).__name__}: {exc}); skipped"

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.iterator = iter(samples)

        def get_next(self):
            return next(self.iterator, None)

        def rewind(self):
            self.iterator = iter(samples)

    quantize_static(source, spec["output"], Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    calibrate_method=CalibrationMethod.MinMax)
    if source != family["model_path"]:
        os.unlink(source)
    return {"quantize_seconds": time.perf_counter() - started, "note": note}


def _quantize_nncf(spec: dict) -> dict:
    import importlib.metadata

    import nncf
    import onnx

    family = spec["family"]
    calibration = batches(family, "calib", spec["calib_samples"])
    model = onnx.load(family["model_path"])
    options = {"model_type": nncf.ModelType.TRANSFORMER} if spec["variant"] == "transformer" else {}
    started = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset(calibration), subset_size=sum(
        len(next(iter(feed.values()))) for feed in calibration), **options)
    done = time.perf_counter()
    onnx.save(quantized, spec["output"])
    return {"quantize_seconds": done - started, "export_seconds": time.perf_counter() - done,
            "versions": {name: importlib.metadata.version(name) for name in ("nncf", "onnx", "onnxruntime")}}


def run_child(spec: dict) -> None:
    """Entry point of a child process: quantize as ``spec`` says, print one JSON line (``error`` on failure)."""
    try:
        result = {"ppqlike": _quantize_ppqlike, "ort": _quantize_ort, "nncf": _quantize_nncf}[spec["tool"]](spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which goes on with the next row
        result = _error(exc)
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent

#: NNCF's rows (``--peers``): its defaults, and its transformer mode
NNCF_VARIANTS = ("default", "transformer")


def configurations(platforms: list[str], recipe: str, with_ort: bool, with_peers: bool = False) -> list[dict]:
    rows = [{"key": f"ppqlike:{p}:{recipe}", "tool": "ppqlike", "platform": p, "recipe": recipe} for p in platforms]
    rows += [{"key": ORT_BASELINE, "tool": "ort"}] if with_ort else []
    return rows + ([{"key": f"nncf:{variant}", "tool": "nncf", "variant": variant} for variant in NNCF_VARIANTS]
                   if with_peers else [])


def score(family: dict, reference: dict, outputs: dict) -> dict:
    """Per-output cosines, their summary and the family metric of ``outputs`` against ``reference``.

    A sample whose quantized output holds a non-finite value has no cosine: it is counted in ``non_finite``
    (fraction of samples) and left out of ``mean`` and ``worst``; the summary (mean over outputs of the
    per-sample means, worst over outputs) leaves out an output with no finite sample, and ``non_finite`` is
    the largest fraction of any output.
    """
    per_output = {}
    for name in family["outputs"]:
        cosine = family_metrics.cosine_per_sample(outputs[name], reference[name])
        finite = cosine[np.isfinite(cosine)]
        per_output[name] = {"mean": float(finite.mean()) if len(finite) else float("nan"),
                            "worst": float(finite.min()) if len(finite) else float("nan"),
                            "non_finite": float(np.mean(~np.isfinite(cosine)))}
    means = np.array([v["mean"] for v in per_output.values()])
    worsts = np.array([v["worst"] for v in per_output.values()])
    finite = np.isfinite(means)
    return {"cosine_mean": float(means[finite].mean()) if finite.any() else float("nan"),
            "cosine_worst": float(worsts[finite].min()) if finite.any() else float("nan"),
            "non_finite": float(max(v["non_finite"] for v in per_output.values())), "outputs": per_output,
            "metric": family_metrics.family_metric(reference, outputs, family["metric"])}


def run_family(family: dict, configs: list[dict], args, workdir: Path, log) -> dict:
    import matrix
    import metrics
    import peers

    name = family["name"]
    dev = batches(family, "dev")
    stacked = family.get("stack", True)
    reference = run_outputs(metrics.ort_session(family["model_path"]), dev, family["outputs"], stacked)
    calib_samples = min(args.calib_samples or family.get("calib_default", family["calib_count"]),
                        family["calib_count"])
    result = {"model": name, "family": family["family"], "weights": family["weights"], "source": family["source"],
              "calib_samples": calib_samples, "dev_samples": family["dev_count"], "fp32_check": family.get("check", ""),
              "rows": []}
    for config in configs:
        output = workdir / f"{name}__{config['key'].replace(':', '_')}.onnx"
        spec = {**config, "family": family, "calib_samples": calib_samples, "output": str(output)}
        python = sys.executable
        if config["tool"] == "nncf":   # quantizes in the peers' venv
            why = peers.unavailable("nncf")
            if why is not None:
                log(f"[{name}] {config['key']}: skipped, {why}")
                result["rows"].append({"config": config["key"], "error": f"skipped: {why}"})
                continue
            python = str(peers.peer_python())
        command = [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        measured = matrix.measure_child(command, output.with_suffix(".log"))
        child = measured.get("child", {})
        row = {"config": config["key"], "wall_seconds": round(measured["wall_seconds"], 1),
               "peak_rss_mb": round(measured["peak_rss_mb"]), **child}
        if "error" in measured or "error" in child:
            row.setdefault("error", measured.get("error"))
            log(f"[{name}] {config['key']}: FAILED {row['error'][:400]} ({row.get('where', '')})")
        else:
            exact = metrics.fused_kernels_exact(output)
            row["accuracy_session"] = "fused" if exact else "unoptimized (fused u8s8 kernels saturate on this CPU)"
            try:
                outputs = run_outputs(metrics.ort_session(output, optimized=exact), dev, family["outputs"], stacked)
            except Exception as exc:  # noqa: BLE001 - an exported model onnxruntime cannot run is a result too
                row["error"] = f"onnxruntime cannot run the exported model: {type(exc).__name__}: {exc}"
                log(f"[{name}] {config['key']}: FAILED {row['error'][:400]}")
                result["rows"].append(row)
                continue
            row.update(score(family, reference, outputs))
            log(f"[{name}] {config['key']}: cosine {row['cosine_mean']:.4f} (worst {row['cosine_worst']:.4f}), "
                f"{row['metric']['kind']} {row['metric']['score']:.3f}; quantize {row['quantize_seconds']:.1f} s, "
                f"wall {row['wall_seconds']} s, {row['peak_rss_mb']} MB")
        result["rows"].append(row)
    return result


def environment() -> dict:
    """Versions and the git commit the measurements were made with."""
    import subprocess

    import onnxruntime
    commit = subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(BENCH.parent), "status", "--porcelain", "--", "ppqlike"],
                           capture_output=True, text=True).stdout.strip()
    return {"git": commit + ("+changes" if dirty else ""), "python": sys.version.split()[0],
            "numpy": np.__version__, "onnxruntime": onnxruntime.__version__, "cpus": os.cpu_count()}


def _cell(value, digits: int = 3) -> str:
    return "nan" if isinstance(value, float) and not np.isfinite(value) else f"{value:.{digits}f}"


def markdown(results: list[dict], skipped: list[str]) -> str:
    """The summary table of every row (errors shortened; the JSON has them whole), then the cosine of each
    output of the multi-output models."""
    lines = ["| model | weights | configuration | output cosine mean | worst | non-finite samples | family metric | "
             "quantize s | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    per_output = ["| model | configuration | " + "output: mean / worst cosine (non-finite samples) |", "|---|---|---|"]
    for result in results:
        weights = "real" if result["weights"] == "real" else "random"
        for row in result["rows"]:
            if "error" in row:
                lines.append(f"| {result['model']} | {weights} | {row['config']} | failed: "
                             f"{row['error'][:160].replace('|', '/')} | | | | | {row['wall_seconds']} |")
                continue
            metric = row["metric"]
            lines.append(f"| {result['model']} | {weights} | {row['config']} | {_cell(row['cosine_mean'], 4)} | "
                         f"{_cell(row['cosine_worst'], 4)} | {_cell(row['non_finite'], 2)} | "
                         f"{metric['kind']} {_cell(metric['score'])} | {row['quantize_seconds']:.1f} | "
                         f"{row['wall_seconds']} |")
            if len(row["outputs"]) > 1:
                cells = "; ".join(f"{name} {_cell(v['mean'], 4)} / {_cell(v['worst'], 4)} ({_cell(v['non_finite'], 2)})"
                                  for name, v in row["outputs"].items())
                per_output.append(f"| {result['model']} | {row['config']} | {cells} |")
    text = "\n".join(lines) + "\n"
    if len(per_output) > 2:
        text += "\n" + "\n".join(per_output) + "\n"
    return text + "".join(f"\nSkipped: {line}" for line in skipped) + ("\n" if skipped else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devset", type=Path, default=DEFAULT_DEVSET, help=f"the families' folder ({DEFAULT_DEVSET})")
    parser.add_argument("--models", default=None, help="comma-separated family names (default: every folder)")
    parser.add_argument("--platforms", default=",".join(PLATFORMS), help=f"ppqlike platforms ({','.join(PLATFORMS)})")
    parser.add_argument("--recipe", default="balanced", help="ppqlike recipe: plain, balanced, best (balanced)")
    parser.add_argument("--calib-samples", type=int, default=None,
                        help="calibration samples (default: each manifest's calib_default)")
    parser.add_argument("--no-ort", action="store_true", help="leave out onnxruntime's quantize_static row")
    parser.add_argument("--peers", action="store_true",
                        help="add NNCF's rows (its defaults, and its transformer mode), run in the peers' venv")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table as Markdown here")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the quantized models here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return run_child(json.loads(args.child))
    platforms = [p.strip().upper() for p in args.platforms.split(",") if p.strip()]
    names = ([n.strip() for n in args.models.split(",") if n.strip()] if args.models else
             sorted(p.name for p in args.devset.iterdir() if p.is_dir()) if args.devset.is_dir() else [])
    configs = configurations(platforms, args.recipe, not args.no_ort, args.peers)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started, load_before = time.perf_counter(), os.getloadavg()
    results, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="ppqlike_families_") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            family = load_family(args.devset / name)
            if family is None:
                skipped.append(f"{name}: model.onnx, calib.npz, dev.npz or manifest.json absent in "
                               f"{args.devset / name} (build it with bench/devset/build.py)")
                log(f"[{name}] skipped: {skipped[-1]}")
                continue
            results.append(run_family(family, configs, args, workdir, log))
    if not names:
        skipped.append(f"no families in {args.devset} (build them with bench/devset/build.py)")
    table = markdown(results, skipped)
    print(table)
    document = {"devset": str(args.devset), "recipe": args.recipe, "platforms": platforms,
                "ort_baseline": not args.no_ort, "calib_samples": args.calib_samples, "environment": environment(),
                "load_average": {"start": load_before, "end": os.getloadavg()},
                "seconds": round(time.perf_counter() - started, 1), "results": results, "skipped": skipped}
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
