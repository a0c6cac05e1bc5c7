"""Calibration data from a folder: images, or .npy/.npz arrays, as a lazily loading batch iterator.

:class:`CalibrationFolder` lists the folder once and then, on every
iteration, reads only the files of the batch it is building: it never holds
more than one batch (plus one array file) in memory, it knows its length
(number of batches) without reading the data, and it can be iterated again
(observers that need two passes over the data get the same batches).

The folder holds one kind of file:

* **images** (``.jpg .jpeg .png .bmp .webp .tif .tiff``), for single-input
  models.  Each image is one sample, read by :func:`ppqlike.io.images.load_image`
  with ``image_options``: shorter side resized (bilinear), centre crop (or a
  letterbox), RGB (or BGR), then ``(x / scale - mean) / std`` per channel with x
  the 0..255 pixel value.  ``layout`` and the size default to what the model's
  input shape says when it is static ([N,3,H,W] is NCHW, [N,H,W,3] NHWC); see
  :func:`ppqlike.io.image_options.resolve_image_options`.
* **arrays**: ``.npy`` files (single-input models) or ``.npz`` files (arrays
  keyed by input name; a single-input model also takes an .npz holding a
  single array under any key).  A file whose array has the rank of the
  model input is a batch of samples; one rank lower is a single sample.
  Samples of all files are regrouped into batches of ``batch_size``.

Files of any other kind are skipped with a :class:`CalibrationDataWarning`
naming them; hidden files (``.name``) and sub-folders are ignored silently.
A folder mixing images and array files, a folder with nothing usable, an
unreadable file, an array of the wrong rank or shape, and NaN or Inf
values are :class:`~ppqlike.core.errors.CalibrationDataError` naming the file.
"""

from __future__ import annotations

import math
import os
import warnings
import zipfile
from typing import Any, Iterator, Mapping

import numpy as np

from ..core.errors import CalibrationDataError
from .calibration_files import CalibrationFileLoader, FileShard, InputSpec, batch_pieces, input_specs
from .files import check_allocation
from .image_options import resolve_image_options
from .images import IMAGE_SUFFIXES, require_pillow

__all__ = ["ARRAY_SUFFIXES", "CalibrationDataWarning", "CalibrationFolder", "InputSpec", "input_specs"]

#: Suffixes of array files (compared case-insensitively).
ARRAY_SUFFIXES = (".npy", ".npz")


class CalibrationDataWarning(UserWarning):
    """Something in the calibration folder was skipped (a file that is neither an image nor an array)."""


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, np.integer)) and dim > 0 else None


def _listing(folder: str) -> tuple[list[str], list[str], list[str]]:
    """(image files, array files, other files) of ``folder``, each sorted; hidden files and folders left out."""
    if not os.path.exists(folder):
        raise CalibrationDataError(f"calibration folder {folder!r} does not exist")
    if not os.path.isdir(folder):
        raise CalibrationDataError(f"calibration path {folder!r} is not a folder; give a folder of images "
                                   "or of .npy/.npz files")
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        raise CalibrationDataError(f"cannot list calibration folder {folder!r}: {error.strerror}") from None
    images, arrays, others = [], [], []
    for name in names:
        if name.startswith(".") or not os.path.isfile(os.path.join(folder, name)):
            continue
        lower = name.lower()
        (images if lower.endswith(IMAGE_SUFFIXES) else arrays if lower.endswith(ARRAY_SUFFIXES)
         else others).append(name)
    return images, arrays, others


def _npy_header(stream) -> tuple[tuple, np.dtype]:
    version = np.lib.format.read_magic(stream)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = reader(stream)
    return tuple(shape), dtype


def _array_shapes(path: str) -> dict[str | None, tuple]:
    """Shapes of the arrays in an .npy (key None) or .npz file, read from the headers only; a header
    claiming more bytes than the file holds (or than the machine has) is refused before any loading."""
    try:
        if path.lower().endswith(".npy"):
            with open(path, "rb") as stream:
                shape, dtype = _npy_header(stream)
                _check_declared(path, None, shape, dtype, os.path.getsize(path) - stream.tell())
                return {None: shape}
        with zipfile.ZipFile(path) as archive:
            shapes = {}
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as stream:
                        shape, dtype = _npy_header(stream)
                        header = stream.tell()
                    _check_declared(path, member[:-4], shape, dtype, archive.getinfo(member).file_size - header)
                    shapes[member[:-4]] = shape
            return shapes
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise CalibrationDataError(f"cannot read calibration file {path!r}: {error}") from None


def _check_declared(path: str, member: str | None, shape: tuple, dtype: np.dtype, stored: int) -> None:
    what = f"calibration file {path!r}" + (f" (array {member!r})" if member else "")
    declared = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize if shape else np.dtype(dtype).itemsize
    check_allocation(declared, what, CalibrationDataError)
    if np.dtype(dtype).kind != "O" and declared > stored:
        raise CalibrationDataError(f"{what}: its header declares shape {list(shape)} of {np.dtype(dtype)} "
                                   f"({declared} bytes) but the file holds {stored} bytes of data; it is "
                                   "truncated or corrupt")


class CalibrationFolder:
    """Batches of calibration data read lazily from a folder (see the module docstring).

    ``inputs``: the model's inputs (a Graph, a mapping name -> shape, or
    InputSpecs); ``batch_size``: samples per batch (the last batch may be
    smaller); ``image_options``: keyword arguments of
    :func:`ppqlike.io.images.load_image` (``layout`` and ``crop`` default to
    the model's).  Iterating yields one array per batch for single-input
    models and a dict input name -> array otherwise.  ``len()`` is the number
    of batches; ``samples`` the number of samples; ``skipped`` the file names
    skipped with a warning.
    """

    def __init__(self, folder: str | os.PathLike, inputs: Any, batch_size: int = 16,
                 image_options: Mapping[str, Any] | None = None):
        self.folder = os.fspath(folder)
        self.specs = input_specs(inputs)
        if not self.specs:
            raise CalibrationDataError("the model has no inputs to calibrate")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise CalibrationDataError(f"batch size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        images, arrays, others = _listing(self.folder)
        if images and arrays:
            raise CalibrationDataError(
                f"calibration folder {self.folder!r} mixes {len(images)} image(s) and {len(arrays)} .npy/.npz "
                f"file(s) (e.g. {images[0]!r}, {arrays[0]!r}); keep one kind per folder")
        if not images and not arrays:
            found = f"; it holds only {len(others)} other file(s), e.g. {others[0]!r}" if others else " (it is empty)"
            raise CalibrationDataError(
                f"calibration folder {self.folder!r} holds no images ({', '.join(IMAGE_SUFFIXES)}) "
                f"and no .npy/.npz files{found}")
        self.skipped = list(others)
        if others:
            shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
            warnings.warn(f"calibration folder {self.folder!r}: skipped {len(others)} file(s) that are neither "
                          f"images nor .npy/.npz: {shown}", CalibrationDataWarning, stacklevel=2)
        self.kind = "images" if images else "arrays"
        if images:
            require_pillow()  # now, not after the passes started
        if self.kind == "images":
            self.files = images
            if len(self.specs) != 1:
                names = [spec.name for spec in self.specs]
                raise CalibrationDataError(f"calibration folder {self.folder!r} holds images, but the model has "
                                           f"{len(names)} inputs {names}; give .npz files keyed by input name")
            self.image_options = resolve_image_options(self.specs[0].name, self.specs[0].shape,
                                                       dict(image_options or {}), self.folder, images)
            self.counts = [1] * len(images)
            self.loader = CalibrationFileLoader(self.folder, tuple(self.specs), "images", self.image_options)
        else:
            self.files = arrays
            self.image_options = {}
            self.sample_shapes: dict[str, dict[str, tuple]] = {}
            self.loader = CalibrationFileLoader(self.folder, tuple(self.specs), "arrays", {})
            self.counts = [self._count(name) for name in arrays]
        self.samples = sum(self.counts)
        if self.samples == 0:
            raise CalibrationDataError(f"calibration folder {self.folder!r}: its array files hold no samples")
        if self.kind == "arrays":
            self._check_batches_of_one_shape()

    # ------------------------------------------------------------------ images
    # ------------------------------------------------------------------ arrays
    def _samples_in(self, name: str, spec: InputSpec, shape: tuple) -> int:
        """Samples in an array of ``shape`` for ``spec``; checks rank and the static non-batch dims."""
        path = os.path.join(self.folder, name)
        if spec.rank is None:
            return int(shape[0]) if shape else 1
        if len(shape) == spec.rank - 1:
            sample_shape, count = shape, 1
        elif len(shape) == spec.rank:
            sample_shape, count = shape[1:], int(shape[0])
        else:
            raise CalibrationDataError(
                f"calibration file {path!r}: input {spec.name!r} has shape {list(spec.shape)} (rank {spec.rank}), "
                f"so an array must have rank {spec.rank} (a batch) or {spec.rank - 1} (one sample); "
                f"got shape {list(shape)}")
        for want, got in zip(spec.shape[1:], sample_shape):
            if _static(want) is not None and want != got:
                raise CalibrationDataError(
                    f"calibration file {path!r}: input {spec.name!r} has shape {list(spec.shape)}, so a sample "
                    f"must have shape {list(spec.shape[1:])}; the array has shape {list(shape)}")
        return count

    def _count(self, name: str) -> int:
        shapes = _array_shapes(os.path.join(self.folder, name))
        assignment = self.loader.assign(name, list(shapes))
        self.sample_shapes[name] = {
            spec.name: tuple(shapes[assignment[spec.name]])[
                0 if spec.rank is not None and len(shapes[assignment[spec.name]]) == spec.rank - 1 else 1:]
            for spec in self.specs}
        counts = {n: self._samples_in(name, spec, shapes[assignment[spec.name]])
                  for n, spec in ((s.name, s) for s in self.specs)}
        if len(set(counts.values())) > 1:
            raise CalibrationDataError(f"calibration file {os.path.join(self.folder, name)!r}: its arrays hold "
                                       f"different numbers of samples {counts}")
        return next(iter(counts.values()))

    def _check_batches_of_one_shape(self) -> None:
        """The samples of each batch must share one shape (an input whose dims are not fixed takes them from
        the arrays): checked from the headers, before any array is read; the error names the files."""
        start = 0
        batch_files: list[str] = []
        for name, count in zip(self.files, self.counts):
            first_batch, last_batch = start // self.batch_size, (start + count - 1) // self.batch_size
            if count and batch_files and first_batch != (start - 1) // self.batch_size:
                batch_files = []
            if count:
                batch_files.append(name)
                for spec in self.specs:
                    shapes = {self.sample_shapes[f][spec.name] for f in batch_files}
                    if len(shapes) > 1:
                        shown = ", ".join(f"{f} {list(self.sample_shapes[f][spec.name])}" for f in batch_files[:4])
                        raise CalibrationDataError(
                            f"calibration files in {self.folder!r} would share a batch of {self.batch_size} with "
                            f"samples of different shapes for input {spec.name!r} of shape {list(spec.shape or [])}: "
                            f"{shown}; give the arrays one shape, or a batch size that keeps them apart "
                            "(--batch-size 1)")
                if last_batch != first_batch:
                    batch_files = [name]
            start += count

    # --------------------------------------------------------------- iterating
    def __len__(self) -> int:
        return math.ceil(self.samples / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.calibration_shard(0, len(self)))

    def calibration_shard(self, start: int, stop: int) -> FileShard:
        """Batches ``start`` to ``stop`` (exclusive) as a :class:`FileShard`: the files they are read from
        and the loader, picklable, for a worker to read them itself (``ppqlike.optim.distributed``)."""
        return FileShard(self.loader, tuple(tuple(p) for p in
                                            batch_pieces(self.files, self.counts, self.batch_size)[start:stop]))

    def describe(self) -> str:
        """One line: how many samples, of which kind, in how many batches."""
        kind = "images" if self.kind == "images" else f"samples from {len(self.files)} array file(s)"
        return f"{self.samples} {kind} in {self.folder!r}, {len(self)} batch(es) of up to {self.batch_size}"

    def __repr__(self) -> str:
        return f"CalibrationFolder({self.describe()})"
