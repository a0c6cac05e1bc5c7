"""Files: the IR version ppqlike writes, reading JSON, and writing a file whole or not at all."""

from __future__ import annotations

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


def same_file(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Whether two paths name the same file, through symbolic links and hard links."""
    first, second = os.fspath(first), os.fspath(second)
    try:
        return os.path.samefile(first, second)
    except OSError:  # one does not exist yet: compare the resolved paths
        return os.path.realpath(first) == os.path.realpath(second)


def check_not_protected(path: str | os.PathLike, protect: tuple = ()) -> None:
    """ExportError when ``path`` is one of the ``protect`` paths (the user's input model)."""
    for other in protect:
        if other is not None and same_file(path, other):
            raise ExportError(f"refusing to write {os.path.abspath(os.fspath(path))!r}: it is the input model "
                              f"{os.fspath(other)!r}; choose another output path")


def _create_private(directory: str, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file in ``directory`` with ordinary permissions (0666 less the umask, applied by the OS)."""
    for _ in range(100):
        candidate = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), candidate
        except FileExistsError:
            continue
    raise ExportError(f"cannot create a temporary file in {directory!r}")


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
