"""ONNX models of any size: writing one whole or not at all (weights beyond protobuf's 2 GiB limit in an
external data file beside it), checking it and opening an onnxruntime session on it."""

from __future__ import annotations

import os
import tempfile
from typing import Callable

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import helper

from ..core.errors import ExportError
from .files import StagedFiles, check_not_protected
from .onnx_tensors import tensor_slots

#: Models whose tensors hold more bytes than this are written with external data (protobuf stops at 2 GiB).
EXTERNAL_DATA_THRESHOLD = 2 ** 31 - 2 ** 28
#: Tensors smaller than this stay in the model file when the others go to the external data file.
EXTERNAL_TENSOR_MIN_BYTES = 1024
_ALIGNMENT = 4096  # offsets of tensors in the data file (lets readers map them)
#: data types stored with several values per byte (4-bit), whose raw size is not count * itemsize
PACKED_TYPES = frozenset(getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
                         if hasattr(onnx.TensorProto, name))


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's values from its shape and type, without reading them (0 for strings)."""
    if not tensor.data_type or tensor.data_type == onnx.TensorProto.STRING:
        return 0
    count = max(0, int(np.prod([int(d) for d in tensor.dims], dtype=object)))
    if tensor.data_type in PACKED_TYPES:
        return (count + 1) // 2
    try:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0


def estimated_model_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the model's tensors held in the proto (external ones left out)."""
    return sum(tensor_nbytes(t) for _, t in tensor_slots(model) if t.data_location != onnx.TensorProto.EXTERNAL)


def _serialized(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, or None when protobuf refuses (over 2 GiB)."""
    try:
        return model.SerializeToString()
    except (ValueError, EncodeError):
        return None


def _copy_fields(source, target, skip: set) -> None:
    """Copy every set field of one protobuf message onto another, except those named in ``skip``."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _rebuilt(model: onnx.ModelProto, convert: Callable) -> onnx.ModelProto:
    """A copy of ``model`` in which ``convert(tensor)`` replaces each initializer and node tensor attribute for
    which it returns a TensorProto (None: copied as it is); the replaced tensors' data is never copied."""
    result = onnx.ModelProto()
    _copy_fields(model, result, skip={"graph"})
    _copy_fields(model.graph, result.graph, skip={"initializer", "node"})
    for tensor in model.graph.initializer:
        replaced = convert(tensor)
        result.graph.initializer.append(tensor if replaced is None else replaced)
    for node in model.graph.node:
        replaced = {a.name: convert(a.t) for a in node.attribute if a.type == onnx.AttributeProto.TENSOR}
        if all(r is None for r in replaced.values()):
            result.graph.node.append(node)
            continue
        new = result.graph.node.add()
        _copy_fields(node, new, skip={"attribute"})
        for attribute in node.attribute:
            if replaced.get(attribute.name) is None:
                new.attribute.append(attribute)
            else:
                copy = new.attribute.add()
                _copy_fields(attribute, copy, skip={"t"})
                copy.t.CopyFrom(replaced[attribute.name])
    return result


def _externalizer(stream, location: str) -> Callable:
    """A ``convert`` for :func:`_rebuilt` that appends a tensor's raw data to ``stream`` (aligned) and
    returns the tensor pointing there; small tensors and tensors without raw data stay as they are."""
    def move(tensor: onnx.TensorProto) -> onnx.TensorProto | None:
        if not tensor.HasField("raw_data") or tensor_nbytes(tensor) < EXTERNAL_TENSOR_MIN_BYTES:
            return None
        stream.write(b"\0" * (-stream.tell() % _ALIGNMENT))
        offset, raw = stream.tell(), tensor.raw_data  # one tensor's bytes at a time
        stream.write(raw)
        moved = onnx.TensorProto()
        _copy_fields(tensor, moved, skip={"raw_data", "external_data", "data_location"})
        moved.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            moved.external_data.add(key=key, value=value)
        return moved
    return move


def write_onnx_model(path: str | os.PathLike, model: onnx.ModelProto, protect: tuple = (),
                     external_data: bool | None = None, staged: StagedFiles | None = None) -> list[str]:
    """Write ``model`` to ``path`` whole or not at all; returns the absolute paths written, model first.

    ``external_data``: True puts every tensor of at least :data:`EXTERNAL_TENSOR_MIN_BYTES` in one file
    ``<model file name>.data`` beside the model (relative location); False never; None (default) when the
    tensors exceed :data:`EXTERNAL_DATA_THRESHOLD` or protobuf refuses the model.  Both files are staged and
    renamed together.  ``staged``: the open :class:`StagedFiles` that reserved ``path`` (what
    ``export_for_platform`` hands its exporters): the data file is then named after the destination and
    staged with it.  Never writes over ``protect`` paths or their external data files.
    """
    temporary = os.path.abspath(os.fspath(path))
    final = staged.destination(temporary) if staged is not None else temporary
    check_not_protected(final, protect)
    for _, tensor in tensor_slots(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ExportError(f"cannot write {final!r}: tensor {tensor.name!r} refers to external data that was "
                              "not loaded; load the model from its path")
    data = None
    if external_data is False or (external_data is None and estimated_model_bytes(model) <= EXTERNAL_DATA_THRESHOLD):
        data = _serialized(model)
        if data is None and external_data is False:
            raise ExportError(f"cannot write {final!r}: the model does not fit in one protobuf file (2 GiB); "
                              "write it with external data")
    if staged is not None:
        return _write_model(staged, temporary, final, model, data, protect)
    with StagedFiles(protect) as own:
        written = _write_model(own, own.reserve(final), final, model, data, protect)
    return written


def _write_model(staged: StagedFiles, temporary: str, final: str, model: onnx.ModelProto, data: bytes | None,
                 protect: tuple) -> list[str]:
    """Write the model (``data``, or when None its weights to ``<final>.data``) into staged temporaries."""
    written = [final]
    if data is None:
        data_final = final + ".data"
        check_not_protected(data_final, protect)
        data_temporary = staged.reserve(data_final)
        try:
            with open(data_temporary, "wb") as stream:
                skeleton = _rebuilt(model, _externalizer(stream, os.path.basename(data_final)))
        except OSError as error:
            raise ExportError(f"cannot write {data_final!r}: {error.strerror}") from None
        data = _serialized(skeleton)
        if data is None:
            raise ExportError(f"cannot write {final!r}: even without its weights the model exceeds protobuf's 2 GiB")
        written.append(data_final)
    try:
        with open(temporary, "wb") as stream:
            stream.write(data)
    except OSError as error:
        raise ExportError(f"cannot write {final!r}: {error.strerror}") from None
    return written


def check_onnx_model(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model`` (not the full check) on a model of any size: tensors in external data,
    and in a model over :data:`EXTERNAL_DATA_THRESHOLD` the large ones, are checked without their values
    (the caller checks those).  Raises what the checker raises."""
    large = estimated_model_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if not large and all(t.data_location != onnx.TensorProto.EXTERNAL for _, t in tensor_slots(model)):
        onnx.checker.check_model(model, full_check=False)
        return

    def placeholder(tensor: onnx.TensorProto) -> onnx.TensorProto | None:
        if tensor.data_location == onnx.TensorProto.EXTERNAL \
                or (large and tensor_nbytes(tensor) >= EXTERNAL_TENSOR_MIN_BYTES):
            return onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=[0])
        return None
    onnx.checker.check_model(_rebuilt(model, placeholder), full_check=False)


def onnxruntime_session(model: onnx.ModelProto, options=None, providers=("CPUExecutionProvider",)):
    """An onnxruntime InferenceSession of ``model``: from its bytes, or, for a model too big for one
    protobuf, written with external data to a private temporary folder and loaded from there."""
    import onnxruntime
    data = _serialized(model) if estimated_model_bytes(model) <= EXTERNAL_DATA_THRESHOLD else None
    if data is not None:
        return onnxruntime.InferenceSession(data, options, providers=list(providers))
    with tempfile.TemporaryDirectory(prefix="ppqlike-ort-", ignore_cleanup_errors=True) as folder:
        path = os.path.join(folder, "model.onnx")
        write_onnx_model(path, model, external_data=True)
        return onnxruntime.InferenceSession(path, options, providers=list(providers))
