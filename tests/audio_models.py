"""Small audio front ends whose float math cannot take a zero (tests only).

``log_mel_model``: frames [N, 20, 64] -> MatMul by a windowed DFT (cos and sin) -> |.|^2 (Mul) -> MatMul by a
mel filterbank -> Clip(min=1e-10) -> Log -> outputs ``logmel`` and ``y`` (a linear head on it): the log-mel front
end of speech and audio classifiers.

``normaliser_model(style)``: frames -> MatMul -> spec, energy = ReduceMean(spec * spec) per frame + 1e-6 (the
guard), then spec divided by the frame's RMS, spelled ``reciprocal`` (spec * Reciprocal(Sqrt(energy))), ``div``
(spec / Sqrt(energy)) or ``pow`` (spec * Pow(energy, -0.5)) -> output ``y``: a frame normaliser (automatic
gain).

``audio_frames``: clips of tones and noise at -6 to -26 dBFS with a quiet stretch at amplitude 1e-4 (8 of the 20
frames), the values a grid tuned to the loud frames rounds to zero.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model

FRAMES, FRAME, BINS, MELS = 20, 64, 33, 16


def _dft() -> np.ndarray:
    n, k = np.arange(FRAME)[:, None], np.arange(BINS)[None, :]
    window = np.hanning(FRAME)[:, None]
    angle = 2 * np.pi * n * k / FRAME
    return np.concatenate([np.cos(angle) * window, -np.sin(angle) * window], axis=1).astype(np.float32)


def _frames_input():
    return [helper.make_tensor_value_info("frames", TensorProto.FLOAT, ["N", FRAMES, FRAME])]


def log_mel_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    mel = np.abs(rng.standard_normal((BINS, MELS))) * (rng.uniform(size=(BINS, MELS)) < 0.3)
    initializers = [numpy_helper.from_array(_dft(), "dft"),
                    numpy_helper.from_array(np.concatenate([mel, mel]).astype(np.float32), "mel"),
                    numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
                    numpy_helper.from_array((0.3 * rng.standard_normal((MELS, 4))).astype(np.float32), "head")]
    nodes = [helper.make_node("MatMul", ["frames", "dft"], ["spec"], name="stft"),
             helper.make_node("Mul", ["spec", "spec"], ["power"], name="power"),
             helper.make_node("MatMul", ["power", "mel"], ["mel_power"], name="mel"),
             helper.make_node("Clip", ["mel_power", "floor"], ["guarded"], name="floor"),
             helper.make_node("Log", ["guarded"], ["logmel"], name="log"),
             helper.make_node("MatMul", ["logmel", "head"], ["y"], name="head")]
    outputs = [helper.make_tensor_value_info("logmel", TensorProto.FLOAT, ["N", FRAMES, MELS]),
               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FRAMES, 4])]
    return make_model(nodes, _frames_input(), outputs, initializers)


def normaliser_model(style: str) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(_dft(), "dft"), numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
                    numpy_helper.from_array(np.array(-0.5, np.float32), "minus_half")]
    nodes = [helper.make_node("MatMul", ["frames", "dft"], ["spec"], name="stft"),
             helper.make_node("Mul", ["spec", "spec"], ["power"], name="power"),
             helper.make_node("ReduceMean", ["power"], ["energy"], name="energy", axes=[-1], keepdims=1),
             helper.make_node("Add", ["energy", "eps"], ["guarded"], name="guard")]
    if style == "reciprocal":
        nodes += [helper.make_node("Sqrt", ["guarded"], ["rms"], name="rms"),
                  helper.make_node("Reciprocal", ["rms"], ["inverse"], name="inverse"),
                  helper.make_node("Mul", ["spec", "inverse"], ["y"], name="scaled")]
    elif style == "div":
        nodes += [helper.make_node("Sqrt", ["guarded"], ["rms"], name="rms"),
                  helper.make_node("Div", ["spec", "rms"], ["y"], name="scaled")]
    else:
        nodes += [helper.make_node("Pow", ["guarded", "minus_half"], ["inverse"], name="inverse"),
                  helper.make_node("Mul", ["spec", "inverse"], ["y"], name="scaled")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FRAMES, 2 * BINS])]
    return make_model(nodes, _frames_input(), outputs, initializers)


def audio_frames(count: int, seed: int) -> np.ndarray:
    """[count, 20, 64] frames of 16 kHz audio: 3 tones at 0.05-0.5 plus noise, frames 10-17 at amplitude 1e-4."""
    rng = np.random.default_rng(seed)
    t = np.arange(FRAMES * FRAME) / 16000
    clips = []
    for _ in range(count):
        tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) for f in rng.uniform(100, 3000, 3))
        clip = rng.uniform(0.05, 0.5) * tones / 3 + 0.01 * rng.standard_normal(t.size)
        clip[10 * FRAME:18 * FRAME] *= 1e-4 / np.abs(clip[10 * FRAME:18 * FRAME]).max()
        clips.append(clip.reshape(FRAMES, FRAME))
    return np.stack(clips).astype(np.float32)
