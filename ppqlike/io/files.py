"""Files: the IR version ppqlike writes, reading JSON, and writing files whole or not at all (ONNX models
of any size: :mod:`ppqlike.io.onnx_files`)."""

from __future__ import annotations

import functools
import json
import os
import secrets
from typing import Any

from ..core.errors import ExportError

#: The IR version of every model ppqlike writes: onnxruntime 1.31 reads IR versions up to 13, and
#: onnx 1.23 writes 14 by default; 10 expresses every opset up to 21.
MAX_IR_VERSION = 10


def read_json(path: str | os.PathLike, what: str, error: type) -> Any:
    """The JSON value in the file at ``path``; ``error`` (a PPQLikeError class) names ``what`` the
    file is when it cannot be read or is not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as failure:
        raise error(f"cannot read {what} {os.fspath(path)!r}: {failure.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as failure:
        raise error(f"{what} {os.fspath(path)!r} is not valid JSON: {failure}") from None


def physical_memory_bytes() -> int | None:
    """The machine's physical memory (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_allocation(nbytes: int, what: str, error: type) -> None:
    """``error`` (a PPQLikeError class) naming ``what`` when allocating ``nbytes`` cannot succeed: a
    negative size, or more than the machine's physical memory.  Checked before allocating, so that a
    file declaring an absurd size is refused with its name instead of exhausting the machine."""
    memory = physical_memory_bytes()
    if nbytes < 0 or (memory is not None and nbytes > memory):
        have = f"; this machine has {memory / 2 ** 30:.1f} GiB" if memory is not None else ""
        raise error(f"{what} declares {nbytes / 2 ** 30:.1f} GiB ({nbytes} bytes){have}: the file is corrupt "
                    "or not meant for this machine")


def same_file(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Whether two paths name the same file, through symbolic links and hard links."""
    first, second = os.fspath(first), os.fspath(second)
    try:
        return os.path.samefile(first, second)
    except OSError:  # one does not exist yet: compare the resolved paths
        return os.path.realpath(first) == os.path.realpath(second)


def check_not_protected(path: str | os.PathLike, protect: tuple = ()) -> None:
    """ExportError when ``path`` is one of the ``protect`` paths (the user's input model) or an
    external data file one of them reads."""
    for other in protect:
        if other is None:
            continue
        if same_file(path, other):
            raise ExportError(f"refusing to write {os.path.abspath(os.fspath(path))!r}: it is the input model "
                              f"{os.fspath(other)!r}; choose another output path")
        if os.path.exists(path) and any(same_file(path, data) for data in _data_files_of(other, path)):
            raise ExportError(f"refusing to write {os.path.abspath(os.fspath(path))!r}: it holds external weight "
                              f"data of the input model {os.fspath(other)!r}; choose another output path")


def _data_files_of(model_path, near) -> tuple:
    """The external data files of the ONNX file ``model_path``, looked at only when ``near`` (an existing
    file) lies in its folder, where the loader requires them to be."""
    try:
        folder = os.path.dirname(os.path.realpath(os.fspath(model_path)))
        if os.path.commonpath([folder, os.path.realpath(os.fspath(near))]) != folder:
            return ()
        status = os.stat(model_path)
    except (OSError, ValueError):
        return ()
    return _external_locations(os.path.realpath(os.fspath(model_path)), status.st_mtime_ns, status.st_size)


@functools.lru_cache(maxsize=16)
def _external_locations(path: str, mtime_ns: int, size: int) -> tuple:
    import onnx
    from .onnx_tensors import tensor_slots
    if size >= 2 ** 31:
        return ()
    try:
        with open(path, "rb") as handle:
            model = onnx.ModelProto.FromString(handle.read())
    except Exception:  # not readable, or not an ONNX model: it reads no data files
        return ()
    folder = os.path.dirname(path)
    return tuple({os.path.join(folder, entry.value) for _, tensor in tensor_slots(model)
                  if tensor.data_location == onnx.TensorProto.EXTERNAL
                  for entry in tensor.external_data if entry.key == "location"})


def _create_private(directory: str, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file in ``directory`` with ordinary permissions (0666 less the umask, applied by the OS)."""
    for _ in range(100):
        candidate = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), candidate
        except FileExistsError:
            continue
    raise ExportError(f"cannot create a temporary file in {directory!r}")


class StagedFiles:
    """Files that appear together or not at all (DESIGN: outputs whole or absent).

    ``with StagedFiles(protect) as staged:`` — :meth:`reserve` checks a destination (its folder exists,
    it is not a folder, not a protected input, not reserved twice) and returns a hidden temporary path
    beside it to write to; reserve every destination before writing any.  Leaving the block normally
    renames every temporary file onto its destination; leaving it by any exception (KeyboardInterrupt,
    SystemExit from a SIGTERM handler included) removes them all.
    """

    def __init__(self, protect: tuple = ()):
        self.protect = tuple(p for p in protect if p is not None)
        self.pending: list[tuple[str, str]] = []

    def destination(self, temporary: str) -> str:
        """The destination a temporary path from :meth:`reserve` is renamed onto."""
        return dict(self.pending)[temporary]

    def reserve(self, path: str | os.PathLike) -> str:
        final = os.path.abspath(os.fspath(path))
        check_not_protected(final, self.protect)
        if any(same_file(final, other) for _, other in self.pending):
            raise ExportError(f"two exported files would share the path {final!r}")
        directory = os.path.dirname(final) or "."
        if not os.path.isdir(directory):
            raise ExportError(f"cannot write {final!r}: folder {directory!r} does not exist")
        if os.path.isdir(final):
            raise ExportError(f"cannot write {final!r}: a folder of that name exists")
        try:
            handle, temporary = _create_private(directory, ".ppqlike-", ".tmp")
        except OSError as error:
            raise ExportError(f"cannot write into folder {directory!r}: {error.strerror}") from None
        os.close(handle)
        self.pending.append((temporary, final))
        return temporary

    def __enter__(self) -> "StagedFiles":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            try:
                for temporary, final in self.pending:
                    os.replace(temporary, final)
            except OSError as error:
                self._remove()
                raise ExportError(f"cannot move an exported file into place: {error}") from None
        else:
            self._remove()
        return False

    def _remove(self) -> None:
        for temporary, _ in self.pending:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes, protect: tuple = ()) -> None:
    """Write ``data`` to ``path`` whole or not at all (temporary file beside it, then rename).

    ``protect`` lists paths (e.g. the user's input model) that must never be overwritten; links are
    resolved before comparing.
    """
    path = os.path.abspath(os.fspath(path))
    check_not_protected(path, protect)
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise ExportError(f"cannot write {path!r}: folder {directory!r} does not exist")
    try:
        handle, temporary = _create_private(directory, ".ppqlike-", ".tmp")
    except OSError as error:
        raise ExportError(f"cannot write into folder {directory!r}: {error.strerror}") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise ExportError(f"cannot write {path!r}: {error.strerror}") from None
