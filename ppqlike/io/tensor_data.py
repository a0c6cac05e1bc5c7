"""Tensor values of an ONNX model: inline ones checked against their declared size, and external weight
data checked before anything is read (inside the model's folder, present, long enough), then read
straight into numpy arrays (one copy of the weights) or into the proto."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.errors import ModelLoadError
from .files import check_allocation
from .onnx_files import PACKED_TYPES, tensor_nbytes
from .onnx_tensors import tensor_slots

_CHUNK = 1 << 26  # bytes per read call (one call cannot read 2 GiB)


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` keeps its values in an external file."""
    return any(t.data_location == onnx.TensorProto.EXTERNAL for _, t in tensor_slots(model))


def _entries(tensor: onnx.TensorProto, where: str) -> tuple[str, int, int | None]:
    """A tensor's external data location, offset and length (None when not given)."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else None
    except ValueError:
        raise ModelLoadError(f"{where}: tensor {tensor.name!r} has an external data offset or length that is not "
                             "a number; the file is corrupt") from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelLoadError(f"{where}: tensor {tensor.name!r} has a negative external data offset or length; "
                             "the file is corrupt")
    return entries.get("location", ""), offset, length


def check_external_data(model: onnx.ModelProto, folder: str, where: str) -> None:
    """Before reading: every external data file resolves (links and '..' followed) inside the model's folder
    and exists, every tensor's declared size fits the machine and lies within its file."""
    root = os.path.realpath(folder)
    sizes: dict[str, int] = {}
    for _, tensor in tensor_slots(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location, offset, length = _entries(tensor, where)
        resolved = os.path.realpath(os.path.join(root, location))
        if not location or os.path.isabs(location) or os.path.commonpath([root, resolved]) != root:
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} reads external data from {location!r}, which "
                                 f"is not inside the model's folder {root!r}; keep the data files beside the model")
        if not os.path.isfile(resolved):
            raise ModelLoadError(f"{where}: its external weight data could not be read (tensor {tensor.name!r} "
                                 f"reads {location!r}, which is missing or not a file); keep the data files "
                                 "beside the model")
        if any(int(d) < 0 for d in tensor.dims):
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} has negative dimensions {list(tensor.dims)}")
        if tensor.data_type == onnx.TensorProto.STRING:
            raise ModelLoadError(f"{where}: string tensor {tensor.name!r} keeps its values in external data, "
                                 "which ONNX does not allow")
        nbytes = tensor_nbytes(tensor)
        check_allocation(nbytes, f"{where}: external tensor {tensor.name!r}", ModelLoadError)
        if length is not None and length != nbytes:
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} declares shape {list(tensor.dims)} ({nbytes} "
                                 f"bytes) but its external data is {length} bytes; the file is corrupt")
        if resolved not in sizes:
            sizes[resolved] = os.path.getsize(resolved)
        if offset + nbytes > sizes[resolved]:
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} needs bytes {offset} to {offset + nbytes} of "
                                 f"external data file {location!r}, which holds {sizes[resolved]} bytes; the "
                                 "file is truncated or belongs to another model")


def read_external_data(model: onnx.ModelProto, folder: str, where: str, arrays: dict | None = None) -> None:
    """Read the external tensors :func:`check_external_data` passed: into ``arrays`` (keyed as
    :func:`ppqlike.io.onnx_files.tensor_slots` names them; the proto keeps its references) or, when
    ``arrays`` is None, into the proto itself."""
    handles: dict[str, object] = {}
    try:
        for key, tensor in tensor_slots(model):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            location, offset, _ = _entries(tensor, where)
            path = os.path.realpath(os.path.join(folder, location))
            if path not in handles:
                handles[path] = open(path, "rb", buffering=0)
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)) if tensor.data_type else None
            if arrays is not None and dtype is not None and dtype.kind in "biufc":
                dims = [int(d) for d in tensor.dims]
                array = np.empty(dims, dtype.newbyteorder("<"))
                _read_into(handles[path], array, offset, tensor.name, location, where)
                arrays[key] = array if sys.byteorder == "little" else array.astype(dtype)
                continue
            raw = np.empty(tensor_nbytes(tensor), np.uint8)
            _read_into(handles[path], raw, offset, tensor.name, location, where)
            loaded = tensor if arrays is None else onnx.TensorProto()
            if arrays is not None:
                loaded.CopyFrom(tensor)
            del loaded.external_data[:]
            loaded.data_location = onnx.TensorProto.DEFAULT
            loaded.raw_data = raw.tobytes()
            if arrays is not None:
                try:
                    arrays[key] = numpy_helper.to_array(loaded)
                except (ValueError, TypeError) as error:
                    raise ModelLoadError(f"{where}: tensor {tensor.name!r} cannot be read: {error}") from None
    except OSError as error:
        raise ModelLoadError(f"{where}: its external weight data could not be read ({error}); "
                             "keep the data files beside the model") from None
    finally:
        for handle in handles.values():
            handle.close()


def _read_into(handle, array: np.ndarray, offset: int, name: str, location: str, where: str) -> None:
    """Fill ``array`` with the bytes at ``offset`` of an open file."""
    view = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
    handle.seek(offset)
    filled = 0
    while filled < len(view):
        count = handle.readinto(view[filled:filled + _CHUNK])
        if not count:
            raise ModelLoadError(f"{where}: external data file {location!r} ends inside tensor {name!r}; "
                                 "the file is truncated")
        filled += count


def embed_arrays(model: onnx.ModelProto, arrays: dict) -> onnx.ModelProto:
    """Put arrays :func:`read_external_data` read back into ``model``'s tensors (for code that reads the
    proto); returns ``model``."""
    for key, tensor in tensor_slots(model):
        if key in arrays and tensor.data_location == onnx.TensorProto.EXTERNAL:
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
            array = np.ascontiguousarray(arrays[key])
            if array.dtype.kind in "biufc":
                tensor.raw_data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            else:  # bfloat16, float8, 4-bit: onnx knows their layout
                tensor.raw_data = numpy_helper.from_array(array).raw_data
    return model


def tensor_value(tensor: onnx.TensorProto, where: str, stored: np.ndarray | None = None) -> np.ndarray:
    """A TensorProto's array (``stored``: the one read from its external data), its declared size checked
    against its data before anything is allocated."""
    if stored is not None:
        return stored
    dims = [int(d) for d in tensor.dims]
    label = f"{where}: tensor {tensor.name!r}"
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelLoadError(f"{label} refers to external weight data that was not loaded; "
                             "load the model from its path")
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{label} has negative dimensions {dims}")
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type) if tensor.data_type else None
    if dtype is not None:
        count = int(np.prod(dims, dtype=object)) if dims else 1
        check_allocation(count * np.dtype(dtype).itemsize, label, ModelLoadError)
        if tensor.HasField("raw_data") and len(tensor.raw_data) != count * np.dtype(dtype).itemsize \
                and np.dtype(dtype).kind not in "OUS" and tensor.data_type not in PACKED_TYPES:
            raise ModelLoadError(f"{label} declares shape {dims} ({count * np.dtype(dtype).itemsize} bytes of "
                                 f"{np.dtype(dtype)}) but holds {len(tensor.raw_data)} bytes; the file is corrupt")
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as error:
        raise ModelLoadError(f"{label} cannot be read: {error}") from None


def sparse_to_dense(sparse: onnx.SparseTensorProto, where: str = "model", stored: tuple = (None, None)) -> np.ndarray:
    """A dense array from a SparseTensorProto (linear or coordinate indices; ``stored``: values and indices
    read from external data); its dense size is checked against the machine before it is allocated."""
    values = tensor_value(sparse.values, where, stored[0])
    indices = tensor_value(sparse.indices, where, stored[1]).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    name = sparse.values.name or "sparse tensor"
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where}: sparse tensor {name!r} has negative dimensions {list(dims)}")
    count = int(np.prod(dims, dtype=object)) if dims else 1
    check_allocation(count * values.dtype.itemsize, f"{where}: sparse tensor {name!r} (dense shape {list(dims)})",
                     ModelLoadError)
    dense = np.zeros(count, dtype=values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    if indices.size and (indices.min() < 0 or indices.max() >= count):
        raise ModelLoadError(f"{where}: sparse tensor {name!r} has indices outside its shape {list(dims)}")
    dense[indices] = values
    return dense.reshape(dims)
