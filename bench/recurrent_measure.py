"""The issue-35 measurement on the real recurrent models of ``bench/recurrent.py`` (run that script).

For each model: FP32 outputs in onnxruntime on held-out inputs; then ppqlike (default recipe) for each
platform, exported and run in onnxruntime; then onnxruntime's ``quantize_static`` (QDQ, MinMax, uint8
activations, int8 weights per tensor and per channel) on the same calibration inputs (per channel on opset 13: onnx's converter first).  Prints one row per
(model, quantizer): mean and worst output cosine against FP32 over the held-out inputs, the share of
held-out decisions equal to FP32's (the text read by CTC, per line, for ddddocr; speech/no speech at 0.5, per
chunk, for Silero VAD; none for NSNet2), and the seconds the quantization took.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime

from recurrent import MODELS, model_inputs


def session(path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def decision(name: str, output: np.ndarray):
    """What the application reads from an output: CTC indices, per-chunk speech flags, or None."""
    if name == "ddddocr":
        best = output.argmax(-1).ravel()
        return tuple(int(i) for k, i in enumerate(best) if i != 0 and (k == 0 or i != best[k - 1]))
    if name == "silero_vad":
        return tuple((output.ravel() > 0.5).tolist())
    return None


def run(path, feeds) -> list[np.ndarray]:
    runner = session(path)
    return [runner.run(None, feed)[0] for feed in feeds]


def score(name: str, outputs, reference) -> dict:
    cosines = [cosine(o, r) for o, r in zip(outputs, reference)]
    if name == "silero_vad":   # per chunk
        same = np.mean(np.concatenate([np.equal(decision(name, o), decision(name, r))
                                       for o, r in zip(outputs, reference)]))
    elif name == "ddddocr":    # per text line
        same = np.mean([decision(name, o) == decision(name, r) for o, r in zip(outputs, reference)])
    else:
        same = None
    return {"mean_cosine": float(np.mean(cosines)), "worst_cosine": float(np.min(cosines)),
            "same_decision": None if same is None else float(same)}


def quantize_static(path: str, out: str, calibration, per_channel: bool) -> str:
    """onnxruntime's quantize_static; per channel on a model below opset 13 it writes DequantizeLinear with
    an axis that opset does not have, so the model is first converted to opset 13 (onnx's converter)."""
    import onnx
    from onnx import version_converter
    from onnxruntime import quantization
    model = onnx.load(path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if per_channel and opset < 13:
        path = str(Path(out).with_suffix(".opset13.onnx"))
        onnx.save(version_converter.convert_version(model, 13), path)
    feeds = iter(calibration)

    class Reader(quantization.CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    quantization.quantize_static(path, out, Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=per_channel)
    return out


def measure(models, platforms, calib: int, test: int) -> list[dict]:
    from ppqlike import api
    rows = []
    print("| model | recurrent ops | quantizer | mean cosine | worst cosine | same decision | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        model = MODELS[name]
        if not model.present:
            print(f"| {name} | absent: python bench/recurrent.py fetch |")
            continue
        calibration = [model_inputs(name, seed) for seed in range(calib)]
        held_out = [model_inputs(name, 10_000 + seed) for seed in range(test)]
        reference = run(model.path, held_out)
        with tempfile.TemporaryDirectory() as folder:
            results = []
            for platform in platforms:
                started = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    graph = api.quantize_onnx_model(str(model.path), calibration, platform=platform)
                    exported = Path(folder) / f"{name}_{platform}.onnx"
                    api.export_ppq_graph(graph, platform, str(exported))
                results.append((f"ppqlike {platform}", exported, time.perf_counter() - started))
            for per_channel in (False, True):
                started = time.perf_counter()
                out = Path(folder) / f"{name}_ort_{per_channel}.onnx"
                quantize_static(str(model.path), str(out), calibration, per_channel)
                results.append((f"onnxruntime quantize_static (per-{'channel' if per_channel else 'tensor'})",
                                out, time.perf_counter() - started))
            for label, path, seconds in results:
                try:
                    outputs = run(path, held_out)
                except Exception as error:   # an export onnxruntime cannot load
                    print(f"| {name} | {model.recurrent} | {label} | fails in onnxruntime: "
                          f"{str(error).splitlines()[0][-160:]} | | | |", flush=True)
                    continue
                row = {"model": name, "quantizer": label, "seconds": seconds, **score(name, outputs, reference)}
                rows.append(row)
                same = "-" if row["same_decision"] is None else f"{row['same_decision']:.3f}"
                print(f"| {name} | {model.recurrent} | {label} | {row['mean_cosine']:.5f} | "
                      f"{row['worst_cosine']:.5f} | {same} | {seconds:.1f} |", flush=True)
    return rows
