"""The benchmark matrix: ppqlike and onnxruntime's quantizer on the three shared models.

    python bench/run.py                                   # the recipe rows beside onnxruntime (< 30 min)
    python bench/run.py --configs all                     # every row of the matrix (hours)
    python bench/run.py --models efficientnet_lite0 --calib-images 32 --dev-images 64 --out /tmp/b.md
    python bench/run.py --tools ppqlike --configs 'ppqlike:*:kl'

Per model: the FP32 model's outputs on the dev images are computed once (onnxruntime); then for
every configuration a child process quantizes with the calibration images (wall time, peak RSS
and CPU time measured by the OS for that process alone, see ``bench/matrix.py``), the quantized
model is evaluated in onnxruntime on the dev images, its throughput is measured against the FP32
model's (interleaved), and for ppqlike another child runs the executor's simulation on the dev
images and compares it with onnxruntime's outputs.  The dev images are only evaluated on.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))


def parse_args(argv=None):
    import matrix
    import presets
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(presets.MODEL_NAMES),
                        help=f"comma-separated, of {', '.join(presets.MODEL_NAMES)}")
    parser.add_argument("--tools", default="ppqlike,ort",
                        help="comma-separated: ppqlike, ort, and the peers nncf, modelopt, quark ('peers': all "
                             "three; they run in their own venv, see bench/README.md)")
    parser.add_argument("--configs", default=None,
                        help="comma-separated globs over the configuration keys, e.g. 'ppqlike:*:kl,ort:MinMax:*' "
                             "(keys: ppqlike:<PLATFORM>:<default|kl|observer|recipe:NAME>[+PASS...], "
                             "ort:<MinMax|Entropy|Percentile>:<per_tensor|per_channel>, nncf:<default|mixed>, "
                             "modelopt:<entropy|max>, quark:<u8s8_pc|a8w8_pc>); 'all' for every row; "
                             "default: the recipe rows beside onnxruntime (matrix.DEFAULT_CONFIGS)")
    parser.add_argument("--calib-images", type=int, default=200, help="calibration images (of 200)")
    parser.add_argument("--dev-images", type=int, default=300, help="evaluation images (of 300)")
    parser.add_argument("--sim-images", type=int, default=32,
                        help="dev images (the first ones) the ppqlike simulation runs on; the numpy executor is "
                             "slow, so 32 by default; 0 for all evaluated")
    parser.add_argument("--batch", type=int, default=16, help="calibration, evaluation and throughput batch")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved throughput repetitions")
    parser.add_argument("--out", default=str(REPO / "docs" / "BENCHMARKS.md"), help="the Markdown report")
    parser.add_argument("--json", default=None, help="also write every measurement as JSON here")
    parser.add_argument("--workdir", default=None, help="where quantized models go (default: a temporary folder, "
                                                        "removed at the end)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in args.model_list if m not in presets.PRESETS]
        if unknown:
            parser.error(f"unknown model(s) {unknown}; choose from {', '.join(presets.MODEL_NAMES)}")
        import peers
        args.tool_list = [tool for t in args.tools.split(",") if t.strip()
                          for tool in (peers.PEER_TOOLS if t.strip() == "peers" else (t.strip(),))]
        known = {"ppqlike", "ort", *peers.PEER_TOOLS}
        if not set(args.tool_list) <= known:
            parser.error(f"--tools takes {', '.join(sorted(known))} (or peers)")
        args.config_list = matrix.select(matrix.all_configs(args.tool_list), args.configs)
    return args


def _load_dev(model: str, count: int, workdir: Path):
    import numpy as np
    import presets
    images, labels, _ = presets.load_images(model, "dev", count)
    path = workdir / f"{model}.dev.npy"
    np.save(path, images)
    return images, labels, path


def run_model(model: str, args, workdir: Path, log, progress=None) -> dict:
    import numpy as np

    import matrix
    import metrics
    import peers
    import presets

    preset = presets.PRESETS[model]
    started = time.perf_counter()
    images, labels, images_path = _load_dev(model, args.dev_images, workdir)
    fp32_session = metrics.ort_session(preset.path)
    reference = metrics.ort_outputs(fp32_session, images, args.batch)  # cached for every row of this model
    fp32 = {**metrics.classification(reference, labels), "images": len(images)}
    throughput_batch = np.ascontiguousarray(images[:args.batch])
    log(f"[{model}] FP32 top-1 {fp32['top1']:.3f} top-5 {fp32['top5']:.3f} on {len(images)} dev images")
    rows: dict[str, dict] = {}
    result = {"model": model, "title": preset.title or model, "fp32": fp32, "rows": rows,
              "reference_top1": preset.reference_top1}
    for config in args.config_list:
        if progress is not None:
            result["seconds"] = time.perf_counter() - started
            progress(result)
        row = {"config": matrix.as_dict(config)}
        rows[config.key] = row
        if config.same_as is not None and config.same_as in rows:
            row["same_as"] = config.same_as
            log(f"[{model}] {config.key}: identical to {config.same_as} (not run twice)")
            continue
        reason = peers.unavailable(config.tool) if config.tool in peers.PEER_TOOLS else None
        if reason is not None:
            row["unavailable"] = reason
            log(f"[{model}] {config.key}: unavailable: {reason}")
            continue
        output = workdir / f"{model}__{config.key.replace(':', '_')}.onnx"
        spec = matrix.spec_for(config, model, args.calib_images, args.batch, output)
        log(f"[{model}] {config.key}: quantizing ...")
        measured = matrix.measure_child(matrix.child_command(spec), output.with_suffix(".log"))
        row["quantization"] = measured
        if "error" in measured:
            log(f"[{model}] {config.key}: FAILED {measured['error'][:500]}")
            continue
        session = metrics.ort_session(output)
        # on x86 CPUs without VNNI onnxruntime's fused u8 x s8 kernels saturate 8-bit weights: accuracy is then
        # measured with the QDQ semantics (no graph optimizations), speed still with the fused session
        exact = metrics.fused_kernels_exact(output)
        row["accuracy_session"] = "fused" if exact else "unoptimized (fused u8s8 kernels saturate on this CPU)"
        outputs = metrics.ort_outputs(session if exact else metrics.ort_session(output, optimized=False),
                                      images, args.batch)
        row["accuracy"] = {**metrics.classification(outputs, labels), **metrics.against_reference(outputs, reference)}
        row["throughput"] = metrics.relative_throughput(session, fp32_session, throughput_batch, args.repetitions)
        row["kernels"] = metrics.runtime_kernels(output)
        del session
        text = (f"top-1 {row['accuracy']['top1']:.3f} agree {row['accuracy']['agreement']:.3f} "
                f"SNR {row['accuracy']['snr_db']:.1f} dB; {measured['wall_seconds']:.1f} s "
                f"{measured['peak_rss_mb']:.0f} MB; {row['throughput']['speedup']:.2f}x FP32")
        if config.tool == "ppqlike":
            deployed = output.with_suffix(".deployed.npy")
            np.save(deployed, outputs)
            count = min(args.sim_images, len(images)) if args.sim_images else len(images)
            sim_spec = {"kind": "simulate", "source": str(preset.path), "config": spec["config"],
                        "images": str(images_path), "deployed": str(deployed), "count": count,
                        "batch": args.batch, "simulated": str(output.with_suffix(".simulated.npy"))}
            sim = matrix.measure_child(matrix.child_command(sim_spec), output.with_suffix(".sim.log"))
            row["simulation"] = sim.get("child", {"error": sim.get("error")})
            row["simulation"]["wall_seconds"] = sim["wall_seconds"]
            if "error" not in sim:
                text += (f"; sim top-1 equal {sim['child'].get('top1_agreement', float('nan')):.3f}, "
                         f"within 1 step {sim['child'].get('within_one_step', float('nan')):.3f}")
            else:
                log(f"[{model}] {config.key}: simulation FAILED {sim['error'][:500]}")
        log(f"[{model}] {config.key}: {text}")
    for key, row in rows.items():  # copy the measurements of identical rows
        if "same_as" in row:
            source = rows[row["same_as"]]
            row.update({k: v for k, v in source.items() if k not in ("config",)}, same_as=row["same_as"])
    result["seconds"] = time.perf_counter() - started
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        import matrix
        matrix.run_child(json.loads(args.child))
        return
    import report

    started = time.perf_counter()
    command = "python bench/run.py" + ("" if not sys.argv[1:] else " " + shlex.join(sys.argv[1:]))
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ppqlike-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    environment = report.environment()

    def log(message: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {message}", flush=True)

    log(f"{environment['cores']} cores, load {environment['load_start']}; work folder {workdir}")
    import peers
    peer_tools = [tool for tool in args.tool_list if tool in peers.PEER_TOOLS]
    results = {"command": command, "environment": environment, "models": [],
               "notes": [peers.versions_note(peer_tools)] if peer_tools else [],
               "options": {"calib_images": args.calib_images, "dev_images": args.dev_images,
                           "sim_images": args.sim_images, "batch": args.batch, "repetitions": args.repetitions}}
    try:
        def save(partial: bool, current: dict | None = None) -> None:
            snapshot = {**results, "models": results["models"] + ([current] if current else []),
                        "seconds": time.perf_counter() - started}
            snapshot["environment"] = {**environment, "load_end": report.load_average(),
                                       "source_end": report.source_fingerprint()}
            report.write(snapshot, args.out, partial=partial)
            if args.json:
                Path(args.json).write_text(json.dumps(snapshot, indent=1, default=str))
            results.update(seconds=snapshot["seconds"], environment=snapshot["environment"])

        for model in args.model_list:
            results["models"].append(run_model(model, args, workdir, log, lambda current: save(True, current)))
            save(partial=model != args.model_list[-1])
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"done in {results['seconds'] / 60:.1f} min; wrote {args.out}")
    for model in results["models"]:
        print(report.summary_line(model))


if __name__ == "__main__":
    main()
