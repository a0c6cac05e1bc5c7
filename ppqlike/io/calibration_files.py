"""Reading calibration batches from files: the loader of one folder, and a shard of its batches.

:class:`CalibrationFileLoader` turns files of a calibration folder into model inputs (an image through
:func:`ppqlike.io.images.load_image`; an .npy/.npz file into arrays keyed by input name, checked).
:class:`FileShard` is a run of batches, each given as the pieces it is made of (file, first sample, end
sample), with the loader that reads them: small and picklable, so a worker process can be sent its files
and read its own batches (``ppqlike.optim.distributed``).  :class:`~ppqlike.io.calibration_data.CalibrationFolder`
iterates through one shard of all its batches, so a shard's batches are the folder's, bit for bit.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..core.errors import CalibrationDataError
from .images import load_image

#: one piece of a batch: (file name in the folder, first sample, end sample (exclusive))
Piece = tuple[str, int, int]


@dataclass(frozen=True)
class InputSpec:
    """What the model expects at one input: name, shape (None or str for a dynamic dim) and dtype."""

    name: str
    shape: tuple | None = None
    dtype: Any = np.float32

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def input_specs(graph_or_specs: Any) -> list[InputSpec]:
    """InputSpecs from a Graph (its ``inputs``), a mapping name -> shape, or a sequence of InputSpec."""
    if hasattr(graph_or_specs, "inputs") and hasattr(graph_or_specs, "operations"):
        return [InputSpec(v.name, None if v.shape is None else tuple(v.shape),
                          np.float32 if v.dtype is None else np.dtype(v.dtype)) for v in graph_or_specs.inputs]
    if isinstance(graph_or_specs, Mapping):
        return [InputSpec(str(k), None if s is None else tuple(s)) for k, s in graph_or_specs.items()]
    specs = list(graph_or_specs)
    if not all(isinstance(s, InputSpec) for s in specs):
        raise CalibrationDataError("inputs must be a Graph, a mapping input name -> shape, or InputSpecs")
    return specs


def batch_pieces(files: Sequence[str], counts: Sequence[int], batch_size: int) -> list[list[Piece]]:
    """For each batch, the pieces of files it is made of, in order: the samples of all files (``counts`` per
    file) regrouped into batches of ``batch_size`` (the last may be smaller)."""
    batches, current, held = [], [], 0
    for name, count in zip(files, counts):
        start = 0
        while start < count:
            take = min(batch_size - held, count - start)
            current.append((name, start, start + take))
            held, start = held + take, start + take
            if held == batch_size:
                batches.append(current)
                current, held = [], 0
    if held:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class CalibrationFileLoader:
    """Reads the files of one calibration folder of ``kind`` 'images' or 'arrays' as inputs ``specs``;
    ``image_options``: :func:`ppqlike.io.images.load_image`'s keyword arguments."""

    folder: str
    specs: tuple
    kind: str
    image_options: Mapping[str, Any]

    def assign(self, name: str, keys: Sequence[str | None]) -> dict[str, str | None]:
        """Input name -> key in the file (None: the .npy array)."""
        path = os.path.join(self.folder, name)
        names = [s.name for s in self.specs]
        if None in keys:  # .npy
            if len(self.specs) != 1:
                raise CalibrationDataError(f"calibration file {path!r} is an .npy file, but the model has "
                                           f"{len(names)} inputs {names}; give .npz files keyed by input name")
            return {names[0]: None}
        if not keys:
            raise CalibrationDataError(f"calibration file {path!r} holds no arrays")
        if len(self.specs) == 1 and len(keys) == 1:
            return {names[0]: keys[0]}
        unknown = sorted(set(keys) - set(names))
        missing = [n for n in names if n not in keys]
        if unknown or missing:
            raise CalibrationDataError(f"calibration file {path!r} holds arrays {sorted(keys)}; they must be "
                                       f"keyed by the model's input names {names}")
        return {n: n for n in names}

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of an .npy/.npz file, keyed by input name, each with its batch axis, checked."""
        path = os.path.join(self.folder, name)
        try:
            if name.lower().endswith(".npy"):
                raw = {None: np.load(path, allow_pickle=False)}
            else:
                with np.load(path, allow_pickle=False) as data:
                    raw = {key: data[key] for key in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
            raise CalibrationDataError(f"cannot read calibration file {path!r}: {error}") from None
        assignment = self.assign(name, list(raw))
        arrays = {}
        for spec in self.specs:
            array = raw[assignment[spec.name]]
            if spec.rank is not None and array.ndim == spec.rank - 1:
                array = array[None]
            if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
                raise CalibrationDataError(f"calibration file {path!r}: array for input {spec.name!r} has dtype "
                                           f"{array.dtype}, not a numeric type")
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise CalibrationDataError(f"calibration file {path!r}: input {spec.name!r} holds NaN or Inf "
                                           "values; clean the data before calibrating")
            arrays[spec.name] = array.astype(spec.dtype, copy=False) if spec.dtype is not None else array
        return arrays

    def image(self, name: str) -> np.ndarray:
        """One preprocessed image, [1, ...]."""
        path = os.path.join(self.folder, name)
        array = load_image(path, **self.image_options)
        if not np.isfinite(array).all():
            raise CalibrationDataError(f"calibration image {path!r} gives NaN or Inf after preprocessing; "
                                       "check --mean/--std/--scale")
        return array

    def concatenate(self, pending: dict, files: list[str]) -> dict[str, np.ndarray]:
        try:
            return {k: np.concatenate(v, axis=0) for k, v in pending.items()}
        except ValueError:
            shapes = {k: sorted({str(list(a.shape[1:])) for a in v}) for k, v in pending.items()}
            raise CalibrationDataError(f"calibration files {sorted(set(files))} in {self.folder!r} hold samples "
                                       f"of different shapes {shapes}; they cannot form one batch") from None

    def finish(self, arrays: dict[str, np.ndarray]):
        """One array for a single-input model, else the dict input name -> array."""
        return arrays[self.specs[0].name] if len(self.specs) == 1 else arrays


@dataclass(frozen=True)
class FileShard:
    """Batches of a calibration folder read from their files: ``batches`` lists each batch's pieces; an array
    file is read once for the consecutive batches it feeds (one file and one batch in memory at a time)."""

    loader: CalibrationFileLoader
    batches: tuple

    @property
    def files(self) -> list[str]:
        """The files this shard reads, in order."""
        return list(dict.fromkeys(name for pieces in self.batches for name, _, _ in pieces))

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader
        if loader.kind == "images":
            for pieces in self.batches:
                batch = np.concatenate([loader.image(name) for name, _, _ in pieces], axis=0)
                yield loader.finish({loader.specs[0].name: batch})
            return
        held_name, held = None, None
        for pieces in self.batches:
            pending: dict[str, list[np.ndarray]] = {s.name: [] for s in loader.specs}
            for name, start, stop in pieces:
                if name != held_name:
                    held_name, held = None, None   # free the last file before reading the next
                    held_name, held = name, loader.arrays(name)
                for key, array in held.items():
                    pending[key].append(array[start:stop])
            yield loader.finish(loader.concatenate(pending, [name for name, _, _ in pieces]))
