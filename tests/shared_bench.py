"""The shared benchmark (real models and real ImageNet images) as test presets.

The presets and the image loading live in ``bench/presets.py`` (no pytest there, so the
benchmarks use them too); this module re-exports them and adds the ``requires_bench`` marker,
which skips tests with a clear reason when the shared folder is absent.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def bench_script(stem: str, sibling_imports: bool = False):
    """``bench/<stem>.py`` loaded as the module ``ppqlike_bench_<stem>`` (once); ``sibling_imports``: the
    script imports other bench/ scripts by name, so bench/ goes on ``sys.path`` first."""
    name = f"ppqlike_bench_{stem}"
    if name not in sys.modules:
        folder = Path(__file__).resolve().parent.parent / "bench"
        if sibling_imports:
            sys.path.insert(0, str(folder))
        spec = importlib.util.spec_from_file_location(name, folder / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


_presets = bench_script("presets")
REPO_DIR = _presets.REPO_DIR
BENCH_DIR = _presets.BENCH_DIR
HAVE_BENCH = _presets.HAVE_BENCH
ModelPreset = _presets.ModelPreset
PRESETS = _presets.PRESETS
MODEL_NAMES = _presets.MODEL_NAMES
wnids = _presets.wnids
label_of = _presets.label_of
load_images = _presets.load_images
quantize_static_with_onnxruntime = _presets.quantize_static_with_onnxruntime

#: Skip marker for tests that need the shared models and images.
requires_bench = pytest.mark.skipif(
    not HAVE_BENCH, reason=f"shared benchmark folder {BENCH_DIR} is absent (real models and images live "
                           "outside the repository; see ../shared/bench/README.md)")

__all__ = ["REPO_DIR", "BENCH_DIR", "HAVE_BENCH", "requires_bench", "ModelPreset", "PRESETS", "MODEL_NAMES",
           "wnids", "label_of", "load_images"]
