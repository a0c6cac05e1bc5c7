"""Prepared weights kept across forwards (issue 17): reused only while the very parameter arrays live and
cannot change in place; a changed parameter is always seen."""

import gc

import numpy as np
import onnx

import ppqlike
from ppqlike.executor.ops import _prepared
from onnx_helpers import run_onnxruntime


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array)
    array.flags.writeable = False
    return array


def test_constant_means_no_writeable_memory_behind_the_array():
    owned = _frozen(np.arange(6.0))
    assert _prepared.is_constant(owned) and _prepared.is_constant(owned.reshape(2, 3)) and _prepared.is_constant(None)
    from_bytes = np.frombuffer(np.arange(6.0).tobytes())          # read-only over immutable bytes
    assert _prepared.is_constant(from_bytes.reshape(3, 2))
    writeable = np.arange(6.0)
    view = writeable.reshape(2, 3)
    view.flags.writeable = False                                  # read-only, but its base can change
    assert not _prepared.is_constant(writeable) and not _prepared.is_constant(view)
    assert not _prepared.is_constant(np.frombuffer(bytearray(16)))


def test_made_once_per_key_and_arrays_and_dropped_with_them():
    calls = []

    def make():
        calls.append(1)
        return len(calls)

    w, b = _frozen(np.ones(4)), _frozen(np.zeros(2))
    assert _prepared.prepared(make, ("test",), (w, b)) == 1
    assert _prepared.prepared(make, ("test",), (w, b)) == 1          # reused
    assert _prepared.prepared(make, ("other",), (w, b)) == 2         # another key
    assert _prepared.prepared(make, ("test",), (w, None)) == 3       # other arrays
    assert _prepared.prepared(make, ("test",), (_frozen(np.ones(4)), b)) == 4   # equal values, another array
    entries = len(_prepared._ENTRIES)
    del w
    gc.collect()
    assert len(_prepared._ENTRIES) <= entries - 3                    # every entry holding w went with it


def test_writeable_arrays_are_prepared_every_call():
    calls = []
    w = np.ones(4)
    for _ in range(3):
        _prepared.prepared(lambda: calls.append(1), ("test",), (w,))
    assert len(calls) == 3


def _depthwise_expansion_model():
    """1x1 Conv (Relu) then a depthwise 3x3 Conv: the chain the channels-last kernels cache weights for."""
    rng = np.random.default_rng(3)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w1", "b1"], ["e"], kernel_shape=[1, 1]),
         onnx.helper.make_node("Relu", ["e"], ["r"]),
         onnx.helper.make_node("Conv", ["r", "w2", "b2"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                               group=32)],
        "chain", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 12, 12])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32, 12, 12])],
        [onnx.numpy_helper.from_array(value.astype(np.float32), name) for name, value in
         (("w1", rng.standard_normal((32, 8, 1, 1))), ("b1", rng.standard_normal(32)),
          ("w2", rng.standard_normal((32, 1, 3, 3))), ("b2", rng.standard_normal(32)))])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_a_parameter_replaced_between_forwards_is_used():
    model = _depthwise_expansion_model()
    x = np.random.default_rng(0).standard_normal((2, 8, 12, 12)).astype(np.float32)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)   # channels-last: the chain runs
    graph = ppqlike.load_onnx_graph(model)
    executor = ppqlike.NumpyExecutor(graph)
    before = len(_prepared._ENTRIES)
    first = executor.forward({"x": x})[0]
    assert len(_prepared._ENTRIES) > before          # the chain's GEMM matrix and tap weights were kept
    np.testing.assert_array_equal(executor.forward({"x": x})[0], first)      # the cached forms: same bits
    np.testing.assert_allclose(first, run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    for name in ("w1", "b1", "w2", "b2"):
        variable = graph.variables[name]
        variable.value = _frozen(variable.value * np.float32(0.5))
        for initializer in model.graph.initializer:
            if initializer.name == name:
                initializer.CopyFrom(onnx.numpy_helper.from_array(variable.value, name))
        np.testing.assert_allclose(executor.forward({"x": x})[0], run_onnxruntime(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4, err_msg=f"after {name} changed")


def test_a_baked_value_is_a_constant_of_its_own():
    from ppqlike import QuantizationProperty, TensorQuantizationConfig
    config = TensorQuantizationConfig(QuantizationProperty.SYMMETRICAL | QuantizationProperty.LINEAR
                                      | QuantizationProperty.PER_TENSOR, scale=0.5, name="w")
    original = np.arange(4, dtype=np.float32)
    config.baked_value = original
    original[0] = 7                                  # the caller's array stays the caller's
    assert config.baked_value[0] == 0 and _prepared.is_constant(config.baked_value)
    config.baked_value = None
    assert config.baked_value is None


def test_an_entry_dropped_with_the_arrays_of_another_entry():
    """A kept result that is itself the key array of another entry (weight codes, then the GEMM matrix made
    from them): when the first goes, the second goes with it, in the same collection, without waiting."""
    import threading

    def drop_both():
        def kept():
            return sorted(key[0] for key in _prepared._ENTRIES if key[0] in ("test codes", "test matrix"))
        weight = _frozen(np.ones(8))
        codes = _prepared.prepared(lambda: _frozen(weight * 2), ("test codes",), (weight,))
        _prepared.prepared(lambda: _frozen(codes.reshape(2, 4).T.copy()), ("test matrix",), (codes,))
        done.append(kept())
        del codes, weight   # the codes live on in their entry: they go when it goes
        gc.collect()
        done.append(kept())
    done = []
    worker = threading.Thread(target=drop_both, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive() and done == [["test codes", "test matrix"], []]


def test_the_oldest_entries_go_past_the_bound(monkeypatch):
    monkeypatch.setattr(_prepared, "_ENTRIES", {})
    monkeypatch.setattr(_prepared, "MAX_ENTRIES", 3)
    arrays = [_frozen(np.full(2, index)) for index in range(5)]
    for index, array in enumerate(arrays):
        _prepared.prepared(lambda index=index: index, ("bounded",), (array,))
    kept = [key for key in _prepared._ENTRIES if key[0] == "bounded"]
    assert len(kept) == 3 and kept == [("bounded", id(array)) for array in arrays[2:]]
