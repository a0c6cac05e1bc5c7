"""Models whose weights live in an external data file: loading, quantizing, exporting, over 2 GB too."""

from __future__ import annotations

import hashlib
import os
import resource
import time

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model
from ppqlike import api
from ppqlike.core.errors import ExportError, ModelLoadError, PlatformError
from ppqlike.io import files, onnx_files
from ppqlike.io.onnx_export import export_onnx_model, save_onnx_graph
from ppqlike.io.onnx_files import check_onnx_model, onnxruntime_session, write_onnx_model

RNG = np.random.default_rng(0)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def small_model() -> onnx.ModelProto:
    """Conv → Relu → Conv → Relu → GlobalAveragePool → Flatten → MatMul → Add, always the same weights."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w3"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b3"], ["y"], name="add")]
    weights = [_init("w1", rng.normal(0, 0.3, (8, 3, 3, 3))), _init("b1", rng.normal(0, 0.1, 8)),
               _init("w2", rng.normal(0, 0.2, (8, 8, 3, 3))), _init("b2", rng.normal(0, 0.1, 8)),
               _init("w3", rng.normal(0, 0.3, (8, 64))), _init("b3", rng.normal(0, 0.1, 64))]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])], weights)


def save_external(model: onnx.ModelProto, path, location=None) -> str:
    """Save a copy of ``model`` with every tensor in one external data file; returns the model's path."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location or os.path.basename(str(path)) + ".data", size_threshold=0)
    return str(path)


def batch(size=2) -> np.ndarray:
    return RNG.normal(size=(size, 3, 8, 8)).astype(np.float32)


def sha(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def run_file(path, feeds) -> list:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    return save_external(small_model(), folder / "model.onnx")


def test_loads_into_arrays_and_runs_like_onnxruntime(source, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("external data must be read straight into arrays, not into the proto")
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_model", never)
    assert os.path.getsize(source) < 1024 and os.path.getsize(source + ".data") > 2000
    graph = ppqlike.load_onnx_graph(source)
    np.testing.assert_array_equal(graph.variables["w2"].value,
                                  numpy_helper.to_array(small_model().graph.initializer[2]))
    x = batch()
    expected = run_file(source, {"x": x})[0]
    np.testing.assert_allclose(ppqlike.NumpyExecutor(graph).forward({"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_quantize_and_export_with_external_data(source, tmp_path, monkeypatch):
    before = {path: sha(path) for path in (source, source + ".data")}
    graph = api.quantize_onnx_model(source, [batch()], platform="ORT_INT8")
    inline = api.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "inline.onnx"))
    assert inline == [str(tmp_path / "inline.onnx")] and not os.path.exists(tmp_path / "inline.onnx.data")
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 0)  # every model is "too big" now
    monkeypatch.setattr(onnx_files, "EXTERNAL_TENSOR_MIN_BYTES", 0)  # and every tensor goes out, scales too
    written = api.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "q.onnx"))
    assert written == [str(tmp_path / "q.onnx"), str(tmp_path / "q.onnx.data")]
    model = onnx.load(str(tmp_path / "q.onnx"), load_external_data=False)
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"q.onnx.data"}
    assert not any(t.HasField("raw_data") for t in model.graph.initializer)
    x = batch()
    np.testing.assert_array_equal(run_file(tmp_path / "q.onnx", {"x": x})[0],
                                  run_file(tmp_path / "inline.onnx", {"x": x})[0])
    assert {path: sha(path) for path in before} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".ppqlike-")]


def test_quantized_model_with_external_data_imports(source, tmp_path, monkeypatch):
    graph = api.quantize_onnx_model(source, [batch()], platform="ORT_INT8")
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 0)
    path = api.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "q.onnx"))[0]
    imported = ppqlike.import_quantized_onnx(path)  # read into the proto, then split
    assert imported.metadata["quantization"]["imported"]["weights"] > 0
    with pytest.raises(PlatformError, match="already quantized"):  # read into arrays, then embedded
        api.quantize_onnx_model(path, [batch()], platform="ORT_INT8")
    exported = api.export_ppq_graph(imported, "ORT_INT8", str(tmp_path / "again.onnx"))
    x = batch()
    np.testing.assert_array_equal(run_file(exported[0], {"x": x})[0], run_file(path, {"x": x})[0])


def test_save_onnx_graph_round_trips_through_external_data(source, tmp_path):
    graph = ppqlike.load_onnx_graph(source)
    out = tmp_path / "fp32.onnx"
    save_onnx_graph(graph, out, external_data=True)
    model = onnx.load(str(out), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert {t.name for t in external} == {"w2", "w3"}  # the others are under EXTERNAL_TENSOR_MIN_BYTES
    for tensor in external:
        entries = {e.key: e.value for e in tensor.external_data}
        assert entries["location"] == "fp32.onnx.data" and int(entries["offset"]) % 4096 == 0
    x = batch()
    np.testing.assert_array_equal(run_file(out, {"x": x})[0], run_file(source, {"x": x})[0])
    again = ppqlike.load_onnx_graph(str(out))
    for name in ("w1", "w2", "b3"):
        np.testing.assert_array_equal(again.variables[name].value, graph.variables[name].value)


def test_automatic_choice_and_session_helper(source, tmp_path, monkeypatch):
    model = export_onnx_model(ppqlike.load_onnx_graph(source))
    assert write_onnx_model(tmp_path / "a.onnx", model) == [str(tmp_path / "a.onnx")]
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_THRESHOLD", 100)
    assert write_onnx_model(tmp_path / "b.onnx", model) == [str(tmp_path / "b.onnx"), str(tmp_path / "b.onnx.data")]
    assert model.graph.initializer[1].HasField("raw_data")  # the model written is left as it was
    check_onnx_model(model)
    x = batch()
    session = onnxruntime_session(model)  # through a temporary folder now
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], run_file(tmp_path / "a.onnx", {"x": x})[0])
    assert write_onnx_model(tmp_path / "c.onnx", model, external_data=False) == [str(tmp_path / "c.onnx")]


def test_staged_model_and_data_appear_together_or_not_at_all(source, tmp_path):
    model = export_onnx_model(ppqlike.load_onnx_graph(source))
    with pytest.raises(RuntimeError):
        with files.StagedFiles() as staged:
            write_onnx_model(staged.reserve(tmp_path / "m.onnx"), model, external_data=True, staged=staged)
            raise RuntimeError("a later file failed")
    assert sorted(os.listdir(tmp_path)) == ["source"]
    with files.StagedFiles() as staged:
        written = write_onnx_model(staged.reserve(tmp_path / "m.onnx"), model, external_data=True, staged=staged)
    assert written == [str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx.data")]
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data", "source"]
    x = batch()
    np.testing.assert_array_equal(run_file(tmp_path / "m.onnx", {"x": x})[0], run_file(source, {"x": x})[0])


def test_never_writes_over_the_source_data_file(tmp_path):
    path = save_external(small_model(), tmp_path / "src.onnx", location="out.onnx.data")
    before = sha(tmp_path / "out.onnx.data")
    graph = api.quantize_onnx_model(path, [batch()], platform="ORT_INT8")
    model = export_onnx_model(ppqlike.load_onnx_graph(path))
    with pytest.raises(ExportError, match="external weight data of the input model"):
        write_onnx_model(tmp_path / "out.onnx", model, protect=(path,), external_data=True)
    with pytest.raises(ExportError, match="external weight data of the input model"):
        write_onnx_model(tmp_path / "out.onnx.data", model, protect=(path,))
    with pytest.raises(ExportError, match="external weight data of the input model"):
        api.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "out.onnx.data"))
    assert sha(tmp_path / "out.onnx.data") == before
    assert sorted(os.listdir(tmp_path)) == ["out.onnx.data", "src.onnx"]


def test_missing_or_truncated_data_file_is_a_clear_error(source):
    data = source + ".data"
    content = open(data, "rb").read()
    with open(data, "wb") as handle:
        handle.write(content[:-64])
    with pytest.raises(ModelLoadError, match=r"model\.onnx.*(truncated|holds)"):
        ppqlike.load_onnx_graph(source)
    os.unlink(data)
    with pytest.raises(ModelLoadError, match=r"model\.onnx.*external.*model\.onnx\.data.*missing"):
        ppqlike.load_onnx_graph(source)
    with pytest.raises(ModelLoadError, match="external"):
        api.quantize_onnx_model(source, [batch()], platform="ORT_INT8")


def test_unloaded_external_references_are_refused(source, tmp_path):
    unloaded = onnx.load(source, load_external_data=False)
    with pytest.raises(ModelLoadError, match="pass the model's path"):
        ppqlike.load_onnx_graph(unloaded)
    with pytest.raises(ExportError, match="not loaded"):
        write_onnx_model(tmp_path / "x.onnx", unloaded)
    assert sorted(os.listdir(tmp_path)) == ["source"]


# A model just over 2 GiB -----------------------------------------------------------------------------------

SLOW = os.environ.get("PPQLIKE_SLOW_TESTS") == "1"
MEMORY = files.physical_memory_bytes()


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="set PPQLIKE_SLOW_TESTS=1 to run the 2 GiB model")
@pytest.mark.skipif(MEMORY is not None and MEMORY < 8 * 2 ** 30, reason="needs about 8 GiB of memory")
def test_model_over_two_gigabytes(tmp_path):
    width, layers = 8192, 9  # nine 256 MiB float32 weights: 2.25 GiB
    path, data = str(tmp_path / "big.onnx"), str(tmp_path / "big.onnx.data")
    nodes, weights, name = [], [], "x"
    with open(data, "wb") as stream:  # written a weight at a time, as onnx.save_model lays it out
        for index in range(layers):
            nodes.append(helper.make_node("MatMul", [name, f"w{index}"], [f"m{index}"], name=f"matmul{index}"))
            nodes.append(helper.make_node("Relu", [f"m{index}"], [f"r{index}"], name=f"relu{index}"))
            name = f"r{index}"
            value = RNG.standard_normal((width, width), dtype=np.float32) * np.float32(width ** -0.5)
            tensor = onnx.TensorProto(name=f"w{index}", data_type=TensorProto.FLOAT, dims=value.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, entry in (("location", "big.onnx.data"), ("offset", stream.tell()), ("length", value.nbytes)):
                tensor.external_data.add(key=key, value=str(entry))
            stream.write(value.tobytes())
            weights.append(tensor)
    nodes[-1].output[0] = "y"
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], weights)
    onnx.save_model(model, path)
    onnx.checker.check_model(path)
    del model, value
    assert os.path.getsize(data) > 2 ** 31
    before = os.stat(data).st_mtime_ns, sha(path)
    x = RNG.standard_normal((1, width), dtype=np.float32)
    started = time.perf_counter()
    graph = ppqlike.load_onnx_graph(path)
    loaded, load_peak = time.perf_counter(), _peak_rss()
    save_onnx_graph(graph, tmp_path / "fp32.onnx")  # over 2 GiB: external data, automatically
    assert os.path.getsize(tmp_path / "fp32.onnx.data") > 2 ** 31
    np.testing.assert_allclose(ppqlike.NumpyExecutor(graph).forward({"x": x})[0],
                               run_file(tmp_path / "fp32.onnx", {"x": x})[0], rtol=1e-4, atol=1e-5)
    del graph
    saved = time.perf_counter()
    quantized = api.quantize_onnx_model(path, [x], platform="ORT_INT8")
    written = api.export_ppq_graph(quantized, "ORT_INT8", str(tmp_path / "q.onnx"))
    done = time.perf_counter()
    assert run_file(written[0], {"x": x})[0].shape == (1, width)
    assert (os.stat(data).st_mtime_ns, sha(path)) == before
    print(f"\n2.25 GiB model: load {loaded - started:.1f} s (peak RSS {load_peak:.2f} GiB), save fp32 + run "
          f"{saved - loaded:.1f} s, quantize + export {done - saved:.1f} s; peak RSS {_peak_rss():.2f} GiB")


def _peak_rss() -> float:
    """This process's peak resident memory so far, in GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
