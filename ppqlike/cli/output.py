"""Output folders of the command line: checked before the work, filled whole or not at all, summarised.

:class:`OutputFolder` is checked (:meth:`OutputFolder.check`) before any
quantization starts, so that an unusable destination fails in a second, and
creates nothing.  :meth:`OutputFolder.commit` creates the folder, lets the
exporter write into a hidden staging folder inside it, then moves each file
into place with an atomic rename; if anything fails the staging folder is
removed, and so is the output folder when this run created it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
from typing import Callable

from ..core.errors import ExportError
from ..io.files import atomic_write_bytes, same_file


class OutputFolder:
    """The destination folder ``path`` of a run, and the input files it must never overwrite."""

    def __init__(self, path: str | os.PathLike, protect: tuple[str, ...] = ()):
        self.path = os.path.abspath(os.fspath(path))
        self.protect = tuple(os.fspath(p) for p in protect if p is not None)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def check(self, names: list[str]) -> None:
        """Raise ExportError if the folder cannot be made or written, or a file would replace an input."""
        for source in self.protect:
            if same_file(self.path, source):
                raise ExportError(f"refusing to use {self.path!r} as the output folder: it is the input model; "
                                  "give --out a folder")
        for name in names:
            target = self.file(name)
            for source in self.protect:
                if same_file(target, source):
                    raise ExportError(f"refusing to write {target!r}: it is the input model; "
                                      "choose another output folder or file name")
            if os.path.isdir(target):
                raise ExportError(f"cannot write {target!r}: a folder of that name exists")
        existing = self.path
        while not os.path.exists(existing):
            parent = os.path.dirname(existing)
            if parent == existing:
                break
            existing = parent
        if not os.path.isdir(existing):
            raise ExportError(f"cannot create output folder {self.path!r}: {existing!r} is a file, not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ExportError(f"cannot create or write output folder {self.path!r}: {existing!r} is not writable")

    def commit(self, produce: Callable[[str], None]) -> list[str]:
        """Create the folder, run ``produce(staging_folder)``, move what it wrote into place; returns the paths."""
        created = []
        probe = self.path
        while not os.path.exists(probe):
            created.append(probe)
            probe = os.path.dirname(probe)
        try:
            os.makedirs(self.path, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".ppqlike-staging-", dir=self.path)
        except OSError as error:
            raise ExportError(f"cannot create output folder {self.path!r}: {error.strerror}") from None
        moved = []
        try:
            produce(staging)
            for name in sorted(os.listdir(staging)):
                source, target = os.path.join(staging, name), self.file(name)
                if name.startswith(".ppqlike-") or not os.path.isfile(source):
                    continue
                if any(same_file(target, p) for p in self.protect):
                    raise ExportError(f"refusing to write {target!r}: it is the input model")
                os.replace(source, target)
                moved.append(target)
        except OSError as error:
            self._abandon(staging, created)
            raise ExportError(f"cannot write into output folder {self.path!r}: {error.strerror}") from None
        except BaseException:
            self._abandon(staging, created)
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return moved

    @staticmethod
    def _abandon(staging: str, created: list[str]) -> None:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                break


def peak_memory_mib() -> float:
    """Peak resident memory of this process so far, in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def dispatch_counts(graph) -> dict:
    """{'TARGET': n, 'FP32': n, 'SOI': n} from graph.metadata['quantization']['dispatch']."""
    dispatch = graph.metadata.get("quantization", {}).get("dispatch", {})
    counts = dispatch.get("counts", {})
    return {key: int(counts.get(key, 0)) for key in ("TARGET", "FP32", "SOI")}


def write_summary(folder: str, name: str, summary: dict) -> None:
    atomic_write_bytes(os.path.join(folder, name), json.dumps(summary, indent=2, default=str).encode())


def print_summary(summary: dict, stream=None) -> None:
    """The short human-readable form of a run's summary."""
    stream = stream or sys.stdout
    counts, platform = summary["ops"], summary["platform"]
    print(f"ppqlike: quantized {summary['model']} for {platform} in {summary['seconds']['total']:.2f} s "
          f"(peak memory {summary['peak_memory_mib']:.0f} MiB)", file=stream)
    print(f"  ops: {counts['TARGET']} on {platform} (TARGET), {counts['FP32']} FP32, {counts['SOI']} SOI "
          f"(dispatcher {summary['dispatcher']})", file=stream)
    calibration = summary.get("calibration")
    if calibration:
        print(f"  calibration: {calibration['description']}; {calibration['batches_used']} batch(es) used",
              file=stream)
    for note in summary.get("export_notes", [])[:5]:
        print(f"  export note: {note}", file=stream)
    recipe = summary.get("recipe") or {}
    if recipe:
        changed = ", ".join(f"{k}={v}" for k, v in recipe.get("changed", {}).items()) or "nothing beyond the setting"
        print(f"  recipe: {recipe.get('recipe')} ({changed}); passes: "
              + ", ".join(p["name"] for p in summary.get("passes", [])), file=stream)
    print(f"  exporter: {summary['exporter']}", file=stream)
    print(f"  wrote into {summary['output_dir']}:", file=stream)
    for role, path in summary["files"].items():
        for one in ([path] if isinstance(path, str) else path):
            print(f"    {role:<8s} {one}", file=stream)
