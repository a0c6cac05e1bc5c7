"""The shared benchmark (real models and real ImageNet images): model presets and image loading.

Pure data and image loading, no pytest: used by the benchmarks (``bench/run.py``) and, through
``tests/shared_bench.py``, by the real-model tests.  ``BENCH_DIR`` is ``<repo>/../shared/bench``
(override with the environment variable PPQLIKE_BENCH_DIR).  Preprocessing per model follows the
bench README: shorter side to 256 (bilinear), centre crop 224, then per model normalisation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO_DIR = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(os.environ.get("PPQLIKE_BENCH_DIR", REPO_DIR.parent / "shared" / "bench")).resolve()
HAVE_BENCH = (BENCH_DIR / "models").is_dir() and (BENCH_DIR / "images").is_dir()


@dataclass(frozen=True)
class ModelPreset:
    """One shared model: file, input name, preprocessing options and FP32 reference top-1."""

    name: str
    file: str
    input_name: str
    options: dict = field(default_factory=dict)  # keyword arguments of ppqlike.io.images.load_image
    reference_top1: dict = field(default_factory=dict)  # split -> FP32 top-1 on onnxruntime
    title: str = ""

    @property
    def path(self) -> Path:
        """The model file inside BENCH_DIR."""
        return BENCH_DIR / "models" / self.file


PRESETS = {
    "efficientnet_lite0": ModelPreset(
        "efficientnet_lite0", "efficientnet_lite0.onnx", "input",
        dict(mean=127.0, std=128.0), {"calib": 0.835, "dev": 0.900}, "EfficientNet-Lite0"),
    "squeezenet1.1": ModelPreset(
        "squeezenet1.1", "squeezenet1.1.onnx", "data_0",
        dict(mean=(103.94, 116.78, 123.68), bgr=True), {"calib": 0.545, "dev": 0.613}, "SqueezeNet 1.1"),
    "mobilenetv2": ModelPreset(
        "mobilenetv2", "mobilenetv2.onnx", "input",
        dict(scale=255, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        {"calib": 0.805, "dev": 0.847}, "MobileNetV2"),
    # the transformer: a saliency map, no labels (compared with the FP32 map; bench/vit.py)
    "vit_s_focus": ModelPreset(
        "vit_s_focus", "vit_s_focus.onnx", "input_image",
        dict(scale=255, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), {}, "ViT-S saliency"),
}
#: The classifiers (top-1 against labels: bench/run.py); the transformer is measured by bench/vit.py.
MODEL_NAMES = tuple(name for name, preset in PRESETS.items() if preset.reference_top1)
TRANSFORMER_NAMES = ("vit_s_focus",)


@lru_cache(maxsize=1)
def wnids() -> tuple[str, ...]:
    """WordNet ids in ILSVRC-2012 class order (line i is class i)."""
    return tuple(line.strip() for line in (BENCH_DIR / "wnids.txt").read_text().splitlines() if line.strip())


def label_of(file_name: str) -> int:
    """The class index of an image from its file name (``n01440764_tench.JPEG`` -> 0)."""
    return wnids().index(Path(file_name).name.split("_", 1)[0])


def image_files(split: str, limit: int | None = None) -> list[Path]:
    """The image files of ``split`` ('calib' or 'dev'), sorted by name, at most ``limit``."""
    from ppqlike.io.images import list_images
    folder = BENCH_DIR / "images" / split
    return [folder / name for name in list_images(folder)][:limit]


class LazyImageBatches:
    """Calibration batches decoded on demand, ``batch`` images at a time (nothing is kept)."""

    def __init__(self, model: str, files, batch: int = 16):
        self.options, self.files, self.batch = PRESETS[model].options, list(files), batch

    def __len__(self):
        return (len(self.files) + self.batch - 1) // self.batch

    def __iter__(self):
        from ppqlike.io.images import load_image
        for start in range(0, len(self.files), self.batch):
            yield np.concatenate([load_image(f, **self.options) for f in self.files[start:start + self.batch]])


@lru_cache(maxsize=8)
def _cached_images(model: str, split: str, limit: int | None):
    from ppqlike.io.images import load_image_folder
    preset = PRESETS[model]
    images, names = load_image_folder(BENCH_DIR / "images" / split, limit=limit, **preset.options)
    images.setflags(write=False)
    return images, np.array([label_of(n) for n in names]), tuple(names)


def load_images(model: str, split: str = "dev", limit: int | None = None):
    """``(images [N,3,224,224] float32, labels [N], file names)`` preprocessed for ``model``; cached, read-only."""
    return _cached_images(model, split, limit)


def quantize_static_with_onnxruntime(model: str, path: str, images, file_format: str = "QDQ",
                                     activations: str = "QUInt8", per_channel: bool = False,
                                     reduce_range: bool = True) -> str:
    """The shared ``model`` quantized by onnxruntime.quantization.quantize_static on ``images`` (batches of 16),
    int8 weights, written to ``path``: a QDQ or QOperator file as onnxruntime's users make them.
    ``reduce_range`` (7-bit weights) is what onnxruntime advises for x86 CPUs without VNNI."""
    from onnxruntime import quantization
    preset = PRESETS[model]
    batches = iter([{preset.input_name: images[i:i + 16]} for i in range(0, len(images), 16)])

    class Reader(quantization.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    quantization.quantize_static(
        str(preset.path), path, Reader(), quant_format=getattr(quantization.QuantFormat, file_format),
        activation_type=getattr(quantization.QuantType, activations), weight_type=quantization.QuantType.QInt8,
        per_channel=per_channel, reduce_range=reduce_range)
    return path
