"""Weight-only 4-bit block quantization (W4A16, issue 36 item 4): ppqlike's RTN / GPTQ / AWQ beside
onnxruntime's MatMul4BitsQuantizer (RTN, GPTQ, HQQ) and NNCF's compress_weights, on the shared ViT-S and the
MiniLM-L6 sentence encoder of the dev set, at block sizes 32 and 128.

    python3 bench/weight_only.py --out /tmp/weight_only                     # both models, every row
    python3 bench/weight_only.py --models vit --blocks 32 --tools ppqlike   # a part

ppqlike runs in this process (signed 4-bit blocks, zero point 0; exported as com.microsoft MatMulNBits, and
also as opset-21 blocked DequantizeLinear to check both formats give the same outputs).  The peers need
onnx_ir (onnxruntime's quantizer) and nncf, which live in the peers' venv (bench/README.md): each peer row runs
as a child process of that venv's Python (``--peer-child``), reading the calibration samples from an .npz
file and writing a model, which is then run in this process's onnxruntime like the others.  The peers' calls:

* ``ort:rtn``: ``MatMulNBitsQuantizer(model, block_size=B, is_symmetric=True,
  algo_config=DefaultWeightOnlyQuantConfig(block_size=B, is_symmetric=True))``
* ``ort:gptq``: the same with ``GPTQWeightOnlyQuantConfig(calibration_data_reader, block_size=B)``
* ``ort:hqq``: the same with ``HQQWeightOnlyQuantConfig(block_size=B, bits=4)`` (asymmetric by design)
* ``nncf:int4_sym``: ``nncf.compress_weights(model, mode=INT4_SYM, group_size=B, ratio=1.0)`` (data-free)
* ``nncf:awq_se``: the same with ``dataset=nncf.Dataset(samples), awq=True, scale_estimation=True``
  (NNCF's ONNX backend has no GPTQ); NNCF keeps its default of 8-bit per-channel weights for the first and
  last layers and also compresses Conv/Gather weights, which ppqlike and onnxruntime leave float.

Every model runs with the session option ``session.qdq_matmulnbits_accuracy_level`` "0" (environment
WEIGHT_ONLY_ACCURACY_LEVEL to change it): onnxruntime fuses the blocked DequantizeLinear -> MatMul of QDQ
files (NNCF's, ppqlike's 'qdq') into MatMulNBits of accuracy level 4 by default, which quantizes the
activations to int8; "0" keeps them float32, W4A16 as the files say (MatMulNBits files carry their own level:
onnxruntime's and ppqlike's write none, float32).

Scores, on held-out inputs (the dev split): per sample, the cosine of the model's output with the FP32 output
(onnxruntime 1.32 running both), mean and worst; the model file size (with external data) over the FP32
file's; the quantization time (wall seconds of the quantization call and the export, for peers measured in
the child).  Printed as a Markdown table; ``--json`` keeps every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEERS_PYTHON = Path(os.environ.get("PPQLIKE_PEERS_PYTHON", REPO.parent / "peers-venv" / "bin" / "python"))
DEVSET = Path(os.environ.get("PPQLIKE_DEVSET", "/work/devmodels"))
ACCURACY_LEVEL = os.environ.get("WEIGHT_ONLY_ACCURACY_LEVEL", "0")
ROWS = ("ppqlike:rtn", "ppqlike:gptq", "ppqlike:awq", "ort:rtn", "ort:gptq", "ort:hqq", "nncf:int4_sym",
        "nncf:awq_se")


# ---------------------------------------------------------------- the peers' child (peers venv: no ppqlike)

def _peer_child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import onnx
    with np.load(spec["calib"]) as data:
        names = list(spec["inputs"])
        count = len(data[names[0]])
        samples = [{name: data[name][i:i + 1] for name in names} for i in range(count)]
    model = onnx.load(spec["model"])
    tool, method, block = spec["tool"], spec["method"], int(spec["block"])
    started = time.perf_counter()
    if tool == "ort":
        from onnxruntime.quantization import matmul_nbits_quantizer as mq
        from onnxruntime.quantization.calibrate import CalibrationDataReader

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.index = 0

            def get_next(self):
                self.index += 1
                return samples[self.index - 1] if self.index <= len(samples) else None

            def rewind(self):
                self.index = 0

        config = {"rtn": lambda: mq.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True),
                  "gptq": lambda: mq.GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(), block_size=block),
                  "hqq": lambda: mq.HQQWeightOnlyQuantConfig(block_size=block, bits=4)}[method]()
        quantizer = mq.MatMulNBitsQuantizer(model, block_size=block, is_symmetric=True, algo_config=config)
        quantizer.process()
        quantized = quantizer.model.model
    else:
        import nncf
        options = {} if method == "int4_sym" else {"dataset": nncf.Dataset(samples), "awq": True,
                                                   "scale_estimation": True, "subset_size": len(samples)}
        quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=block,
                                          ratio=1.0, **options)
    onnx.save(quantized, spec["output"])
    seconds = time.perf_counter() - started
    Path(spec["result"]).write_text(json.dumps({"seconds": seconds}))


# ---------------------------------------------------------------- data

def _model_data(name: str, calib: int | None, dev: int | None) -> dict | None:
    """Model path, input names, calibration feeds and dev feeds of ``name`` (None when its files are absent)."""
    sys.path[:0] = [str(REPO), str(BENCH)]
    if name == "vit":
        import presets
        if not presets.HAVE_BENCH:
            return None
        model = "vit_s_focus"
        images = presets.load_images(model, "calib", calib or 32)[0]
        dev_images = presets.load_images(model, "dev", dev or 64)[0]
        input_name = "input_image"
        return {"path": str(presets.PRESETS[model].path), "inputs": [input_name],
                "calib": [{input_name: images[i:i + 8]} for i in range(0, len(images), 8)],
                "dev": [{input_name: dev_images[i:i + 16]} for i in range(0, len(dev_images), 16)]}
    import families
    family = families.load_family(DEVSET / name)
    if family is None:
        return None
    return {"path": family["model_path"], "inputs": list(family["inputs"]),
            "calib": families.batches(family, "calib", calib or family.get("calib_default")),
            "dev": families.batches(family, "dev", dev)}


def _outputs(path: str, feeds: list[dict]) -> np.ndarray:
    """The first output of the model at ``path`` (onnxruntime, CPU) on every feed, one row per sample."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 2, 3
    # W4A16 as the files say: onnxruntime's fusion of blocked DequantizeLinear -> MatMul would otherwise make
    # MatMulNBits nodes of accuracy level 4 (int8 activations); MatMulNBits files are not affected
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", ACCURACY_LEVEL)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    parts = [session.run(None, feed)[0] for feed in feeds]
    return np.concatenate([p.reshape(len(p), -1) for p in parts]).astype(np.float64)


def _cosines(output: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return (output * reference).sum(1) / (np.linalg.norm(output, axis=1) * np.linalg.norm(reference, axis=1))


def _size(path: str) -> int:
    """The model file plus any external data file beside it."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    extra = set()
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                extra.add(os.path.join(os.path.dirname(path), entry.value))
    return os.path.getsize(path) + sum(os.path.getsize(p) for p in extra)


# ---------------------------------------------------------------- the rows

def _ppqlike_row(data: dict, method: str, block: int, folder: Path) -> dict:
    import ppqlike
    from ppqlike import QuantizationSetting
    setting = QuantizationSetting(weight_only_bits=4, weight_only_block_size=block, weight_only_method=method,
                                  weight_only_format="matmulnbits")
    started = time.perf_counter()
    graph = ppqlike.quantize_onnx_model(data["path"], data["calib"], platform="ORT_INT8", setting=setting)
    output = str(folder / f"ppqlike_{method}_{block}.onnx")
    ppqlike.export_ppq_graph(graph, "ORT_INT8", output)
    seconds = time.perf_counter() - started
    qdq = str(folder / f"ppqlike_{method}_{block}.qdq.onnx")
    ppqlike.export_ppq_graph(graph, "ORT_INT8", qdq, weight_only_format="qdq")
    targets = sum(op.config is not None for op in graph.operations.values())
    return {"model_path": output, "qdq_path": qdq, "seconds": seconds, "quantized_layers": targets}


def _peer_row(data: dict, tool: str, method: str, block: int, folder: Path) -> dict:
    if not PEERS_PYTHON.is_file():
        return {"error": f"the peers' venv {PEERS_PYTHON} is absent (bash bench/peers_venv.sh)"}
    calib = folder / "calib.npz"
    if not calib.is_file():
        arrays = {name: np.concatenate([feed[name] for feed in data["calib"]]) for name in data["inputs"]}
        np.savez(calib, **arrays)
    output = folder / f"{tool}_{method}_{block}.onnx"
    spec = {"tool": tool, "method": method, "block": block, "model": data["path"], "inputs": data["inputs"],
            "calib": str(calib), "output": str(output), "result": str(output) + ".json"}
    spec_path = folder / f"{tool}_{method}_{block}.spec.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([str(PEERS_PYTHON), __file__, "--peer-child", str(spec_path)], capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0 or not output.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0][:300]}"}
    return {"model_path": str(output), "seconds": json.loads(Path(spec["result"]).read_text())["seconds"]}


def measure(models, blocks, rows, folder: Path) -> list[dict]:
    results = []
    for name in models:
        data = _model_data(name, None, None)
        if data is None:
            print(f"{name}: its files are absent, skipped", flush=True)
            continue
        reference = _outputs(data["path"], data["dev"])
        fp32_size = _size(data["path"])
        for block in blocks:
            place = folder / name
            place.mkdir(parents=True, exist_ok=True)
            for row in rows:
                tool, method = row.split(":")
                try:
                    made = (_ppqlike_row(data, method, block, place) if tool == "ppqlike"
                            else _peer_row(data, tool, method, block, place))
                except Exception as error:   # a failed row is reported, the run goes on
                    made = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                entry = {"model": name, "row": row, "block": block, **made}
                if "model_path" in made:
                    try:
                        cos = _cosines(_outputs(made["model_path"], data["dev"]), reference)
                    except Exception as error:   # a model onnxruntime refuses to run
                        entry["error"] = f"onnxruntime: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
                        results.append(entry)
                        print(_line(entry), flush=True)
                        continue
                    entry.update({"cosine_mean": float(cos.mean()), "cosine_worst": float(cos.min()),
                                  "size_ratio": _size(made["model_path"]) / fp32_size, "samples": len(cos)})
                    if "qdq_path" in made:
                        qdq = _cosines(_outputs(made["qdq_path"], data["dev"]), reference)
                        entry["qdq_cosine_mean"] = float(qdq.mean())
                        entry["qdq_size_ratio"] = _size(made["qdq_path"]) / fp32_size
                results.append(entry)
                print(_line(entry), flush=True)
    return results


def _line(entry: dict) -> str:
    if "error" in entry:
        return f"| {entry['model']} | {entry['block']} | {entry['row']} | failed: {entry['error']} | | | |"
    return (f"| {entry['model']} | {entry['block']} | {entry['row']} | {entry['cosine_mean']:.5f} | "
            f"{entry['cosine_worst']:.4f} | {entry['size_ratio']:.3f} | {entry['seconds']:.1f} |")


HEADER = ("| model | block | row | mean cosine | worst | size / FP32 | quantization s |\n"
          "|---|---|---|---|---|---|---|")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit,minilm", help="vit, minilm (default both)")
    parser.add_argument("--blocks", default="32,128", help="block sizes (default 32,128)")
    parser.add_argument("--tools", default="ppqlike,ort,nncf", help="ppqlike, ort, nncf (default all)")
    parser.add_argument("--skip", default="", help="rows left out, e.g. ort:gptq (comma-separated)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the models (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--peer-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_child:
        _peer_child(args.peer_child)
        return
    tools = args.tools.split(",")
    rows = [row for row in ROWS if row.split(":")[0] in tools and row not in args.skip.split(",")]
    folder = args.out or Path(tempfile.mkdtemp(prefix="weight_only_"))
    print(HEADER, flush=True)
    results = measure(args.models.split(","), [int(b) for b in args.blocks.split(",")], rows, folder)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "python": sys.version.split()[0],
                                         "load_average": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
