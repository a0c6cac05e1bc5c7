"""Synthesised audio of the dev set: speech-like and music-like signals, loud and quiet, with silences.

No recordings ship with any package we may use, so the signals are built from what makes speech and music
hard for a quantized front end: harmonic voiced segments with moving pitch and formants, noise-like
fricatives and bursts, notes with attacks and decays, chords, drums, background noise, clips from -6 to -60
dBFS, and pauses of digital silence (exact zeros, where a log-mel front end meets its Clip floor).
"""

from __future__ import annotations

import numpy as np

# (F1, F2, F3) in Hz of a few vowels (adult speaker, rounded textbook values)
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410), (440, 1020, 2240))


def _envelope(length: int, attack: int, release: int) -> np.ndarray:
    env = np.ones(length, np.float64)
    attack, release = min(attack, length // 2), min(release, length // 2)
    if attack:
        env[:attack] = np.linspace(0, 1, attack)
    if release:
        env[length - release:] *= np.linspace(1, 0, release)
    return env


def _formant_gain(freq: np.ndarray, formants) -> np.ndarray:
    """Spectral envelope of a vowel: a sum of resonance peaks (bandwidth about 80-120 Hz) on a -12 dB/oct tilt."""
    gain = np.zeros_like(freq)
    for centre, bandwidth in zip(formants, (90.0, 110.0, 150.0)):
        gain += 1.0 / (1.0 + ((freq - centre) / bandwidth) ** 2)
    return gain / (1.0 + (freq / 500.0) ** 2) ** 0.5


def _voiced(rng, length: int, rate: int, f0: float) -> np.ndarray:
    """A voiced syllable: harmonics of a gliding pitch shaped by formants moving from one vowel to another."""
    t = np.arange(length) / rate
    contour = f0 * (1 + rng.uniform(-0.2, 0.2) * t / max(t[-1], 1e-3)) * (1 + 0.01 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(contour) / rate
    start, end = VOWELS[rng.integers(len(VOWELS))], VOWELS[rng.integers(len(VOWELS))]
    mix = np.linspace(0, 1, length)[:, None]
    formants = (1 - mix) * np.asarray(start) + mix * np.asarray(end)   # [length, 3]
    signal = np.zeros(length)
    for k in range(1, int(rate / 2 / (f0 * 1.25))):
        signal += _formant_gain(k * contour, formants.T) * np.sin(k * phase)
    return signal * _envelope(length, rate // 100, rate // 50)


def _noise_burst(rng, length: int, rate: int) -> np.ndarray:
    """A fricative or plosive: white noise, high-passed by differencing, with a short envelope."""
    noise = np.diff(rng.standard_normal(length + 1)) * rng.uniform(0.05, 0.3)
    return noise * _envelope(length, rate // 200, rate // 100)


def speech_like(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    """An utterance: syllables (voiced, with fricatives and bursts), pauses of exact silence, a random level from
    -6 to -60 dBFS, in a third of the clips background noise; float32 in [-1, 1]."""
    length = int(seconds * rate)
    out = np.zeros(length)
    f0 = rng.uniform(90, 260)
    position = int(rng.integers(0, rate // 4))
    while position < length:
        kind = rng.random()
        if kind < 0.15:      # a pause of digital silence
            position += int(rng.uniform(0.08, 0.4) * rate)
            continue
        size = int(rng.uniform(0.06, 0.3) * rate)
        part = _noise_burst(rng, size // 2, rate) if kind < 0.35 else _voiced(rng, size, rate, f0)
        end = min(length, position + len(part))
        out[position:end] += part[:end - position]
        position = end + int(rng.integers(0, rate // 20))
    return _levelled(rng, out, noisy=rng.random() < 0.33)


def _note(rng, length: int, rate: int, midi: float, plucked: bool) -> np.ndarray:
    t = np.arange(length) / rate
    freq = 440.0 * 2 ** ((midi - 69) / 12)
    vibrato = 0 if plucked else 0.004 * np.sin(2 * np.pi * rng.uniform(4, 6) * t)
    phase = 2 * np.pi * np.cumsum(freq * (1 + vibrato)) / rate
    tone = sum(np.sin(k * phase) / k ** rng.uniform(0.8, 1.6) for k in range(1, int(rate / 2 / freq) + 1) if k < 16)
    decay = np.exp(-t * rng.uniform(1.5, 6.0)) if plucked else _envelope(length, rate // 20, rate // 10)
    return tone * decay * _envelope(length, rate // 500, rate // 200)


def music_like(rng: np.random.Generator, samples: int, rate: int) -> np.ndarray:
    """A clip of music: melody notes and chords (plucked or sustained), drum-like noise hits, now and then a
    quiet passage or silence; random level from -6 to -60 dBFS; float32 in [-1, 1]."""
    out = np.zeros(samples)
    key = int(rng.integers(40, 70))
    scale = np.array([0, 2, 4, 5, 7, 9, 11, 12, 14, 16])
    position = 0
    while position < samples:
        length = int(rng.uniform(0.1, 0.8) * rate)
        if rng.random() < 0.12:
            position += length // 2
            continue
        end = min(samples, position + length)
        plucked = rng.random() < 0.6
        pitches = [key + scale[rng.integers(len(scale))]]
        if rng.random() < 0.35:       # a chord
            pitches += [pitches[0] + 4, pitches[0] + 7] if rng.random() < 0.5 else [pitches[0] - 12]
        for pitch in pitches:
            out[position:end] += _note(rng, length, rate, pitch, plucked)[:end - position] * rng.uniform(0.3, 1.0)
        if rng.random() < 0.3:        # a drum hit
            hit = min(samples - position, rate // 8)
            out[position:position + hit] += rng.standard_normal(hit) * np.exp(-np.arange(hit) / (rate / 60)) * 0.5
        position += int(length * rng.uniform(0.5, 1.0))
    if rng.random() < 0.3:            # a quiet passage: the second half 30 dB down
        out[samples // 2:] *= 10 ** (-30 / 20)
    return _levelled(rng, out, noisy=rng.random() < 0.2)


def _levelled(rng, signal: np.ndarray, noisy: bool) -> np.ndarray:
    peak = np.max(np.abs(signal))
    if peak > 0:
        signal = signal / peak * 10 ** (rng.uniform(-60, -6) / 20)
    if noisy:
        signal = signal + rng.standard_normal(len(signal)) * 10 ** (rng.uniform(-70, -40) / 20)
    return np.clip(signal, -1, 1).astype(np.float32)
