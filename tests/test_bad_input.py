"""Bad model files: each raises a ppqlike error naming the file (or node) and the fault, and writes nothing."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model
from ppqlike.core.errors import GraphError, ModelLoadError, PPQLikeError, UnsupportedOperationError
from ppqlike.executor import NumpyExecutor
from ppqlike.io import load_onnx_graph
from shared_bench import PRESETS, requires_bench


def _info(name, shape=(2,)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _snapshot(folder):
    """Every file under ``folder`` with its bytes and modification time."""
    state = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                state[path] = (handle.read(), os.stat(path).st_mtime_ns)
    return state


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder that is also the working directory; the test asserts nothing in it changed."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _expect_error(workdir, source, *fragments, error=PPQLikeError):
    """Load ``source``; it must raise ``error`` whose message holds every fragment; nothing is written."""
    before = _snapshot(workdir)
    with pytest.raises(error) as info:
        load_onnx_graph(source)
    message = str(info.value)
    assert isinstance(info.value, PPQLikeError)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert _snapshot(workdir) == before
    return message


def _save(workdir, model, name="model.onnx"):
    path = workdir / name
    path.write_bytes(model.SerializeToString())  # onnx.save would not check either; this is explicit
    return str(path)


def _one_node_model(node, opset=13, extra_opsets=()):
    graph = helper.make_graph([node], "bad", [_info("x")], [_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                              + [helper.make_opsetid(d, 1) for d in extra_opsets])
    model.ir_version = 10
    return model


def _good_model_bytes():
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32), "w")
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_info("x", (1, 64))],
                       [_info("y", (1, 64))], [weights])
    return model.SerializeToString()


def test_random_bytes(workdir):
    path = workdir / "random.onnx"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    _expect_error(workdir, str(path), "random.onnx", "not an ONNX model", error=ModelLoadError)


def test_text_file(workdir):
    path = workdir / "notes.onnx"
    path.write_text("name,value\nscale,0.5\n" * 40)
    _expect_error(workdir, str(path), "notes.onnx", "not an ONNX model", error=ModelLoadError)


def test_jpeg_file(workdir):
    image = pytest.importorskip("PIL.Image")
    path = workdir / "photo.jpg"
    image.fromarray(np.random.default_rng(2).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    _expect_error(workdir, str(path), "photo.jpg", "not an ONNX model", "JPEG", error=ModelLoadError)


def test_empty_file(workdir):
    path = workdir / "empty.onnx"
    path.write_bytes(b"")
    _expect_error(workdir, str(path), "empty.onnx", "holds no graph", error=ModelLoadError)


def test_truncated_model(workdir):
    data = _good_model_bytes()
    path = workdir / "half.onnx"
    path.write_bytes(data[:len(data) // 2])
    _expect_error(workdir, str(path), "half.onnx", "truncated", error=ModelLoadError)


@requires_bench
def test_truncated_real_model(workdir):
    data = PRESETS["squeezenet1.1"].path.read_bytes()
    path = workdir / "squeezenet_half.onnx"
    path.write_bytes(data[:len(data) // 2])
    _expect_error(workdir, str(path), "squeezenet_half.onnx", "truncated", error=ModelLoadError)


def test_model_failing_onnx_checker(workdir):
    path = _save(workdir, _one_node_model(helper.make_node("Relu", ["x"], ["y"], name="relu1", bogus=3)))
    message = _expect_error(workdir, path, "model.onnx", "fails onnx.checker", error=ModelLoadError)
    assert "bogus" in message and "relu1" in message


def test_node_of_unknown_domain_fails_when_the_executor_plans(workdir):
    node = helper.make_node("FancyOp", ["x"], ["y"], name="fancy1", domain="com.acme")
    path = _save(workdir, _one_node_model(node, extra_opsets=["com.acme"]))
    before = _snapshot(workdir)
    graph = load_onnx_graph(path)  # loading is fine: the op might be replaced before running
    with pytest.raises(UnsupportedOperationError) as info:
        NumpyExecutor(graph)
    for fragment in ("FancyOp", "fancy1", "com.acme"):
        assert fragment in str(info.value)
    assert _snapshot(workdir) == before


def test_unknown_default_domain_op_type(workdir):
    path = _save(workdir, _one_node_model(helper.make_node("Frobnicate", ["x"], ["y"], name="frob1")))
    _expect_error(workdir, path, "model.onnx", "'frob1'", "'Frobnicate'", "not an ONNX operator",
                  error=ModelLoadError)


def test_op_newer_than_the_model_opset(workdir):
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=1)
    path = _save(workdir, _one_node_model(node, opset=13))
    _expect_error(workdir, path, "'gn'", "opset 13", error=ModelLoadError)


def test_input_nothing_produces(workdir):
    # Node order is valid; the input 'ghost' simply does not exist.  Our own check fires before the checker.
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="first"),
                        helper.make_node("Add", ["a", "ghost"], ["y"], name="adder")],
                       [_info("x")], [_info("y")])
    path = _save(workdir, model)
    _expect_error(workdir, path, "model.onnx", "'ghost'", "'adder'", "not produced", error=GraphError)


def test_cycle(workdir):
    model = make_model([helper.make_node("Add", ["x", "b"], ["a"], name="loop_add"),
                        helper.make_node("Relu", ["a"], ["b"], name="loop_relu"),
                        helper.make_node("Neg", ["a"], ["y"], name="out")],
                       [_info("x")], [_info("y")])
    path = _save(workdir, model)
    _expect_error(workdir, path, "model.onnx", "cycle", "loop_add", "loop_relu", error=GraphError)


def test_cycle_is_caught_even_without_onnx_checker(workdir, monkeypatch):
    """Our checks do not rely on onnx.checker: switch it off and the faults are still ours."""
    monkeypatch.setattr(onnx.checker, "check_model", lambda *args, **kwargs: None)
    model = make_model([helper.make_node("Add", ["x", "b"], ["a"], name="loop_add"),
                        helper.make_node("Relu", ["a"], ["b"], name="loop_relu"),
                        helper.make_node("Neg", ["a"], ["y"], name="out")],
                       [_info("x")], [_info("y")])
    _expect_error(workdir, model, "cycle", "loop_add", error=GraphError)
    model = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [_info("x")], [_info("y")])
    _expect_error(workdir, model, "'ghost'", "'adder'", error=GraphError)
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r1"), helper.make_node("Neg", ["x"], ["y"], name="r2")],
                       [_info("x")], [_info("y")])
    _expect_error(workdir, model, "'y'", "written twice", error=GraphError)


def test_graph_output_nothing_produces(workdir):
    model = make_model([helper.make_node("Relu", ["x"], ["a"])], [_info("x")], [_info("y")])
    _expect_error(workdir, _save(workdir, model), "model.onnx", "graph output 'y'", error=PPQLikeError)


def test_non_existent_path(workdir):
    _expect_error(workdir, str(workdir / "nowhere" / "model.onnx"), "model.onnx", "no such file",
                  error=ModelLoadError)


def test_folder_instead_of_file(workdir):
    (workdir / "folder.onnx").mkdir()
    _expect_error(workdir, str(workdir / "folder.onnx"), "folder.onnx", "not a file", error=ModelLoadError)


def test_unsupported_opset(workdir):
    path = _save(workdir, _one_node_model(helper.make_node("Relu", ["x"], ["y"]), opset=9))
    _expect_error(workdir, path, "model.onnx", "opset 9", "11-23", error=ModelLoadError)


def test_missing_external_data(workdir):
    weights = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_info("x", (1, 16))],
                       [_info("y", (1, 16))], [weights])
    onnx.save(model, str(workdir / "ext.onnx"), save_as_external_data=True, location="ext.bin", size_threshold=0)
    os.unlink(workdir / "ext.bin")
    _expect_error(workdir, str(workdir / "ext.onnx"), "ext.onnx", "external", error=ModelLoadError)


def test_subgraph_of_an_op_ppqlike_does_not_read(workdir):
    """If/Loop/Scan/SequenceMap bodies load (tests/test_control_flow.py); a subgraph of any other op (here of
    a custom domain's) is refused, naming it."""
    body = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "body", [_info("s")], [_info("t")])
    model = make_model([helper.make_node("MapEach", ["seq"], ["out"], name="mapping", domain="com.example",
                                         body=body)],
                       [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
                       [helper.make_tensor_sequence_value_info("out", TensorProto.FLOAT, None)], opset=17)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    _expect_error(workdir, _save(workdir, model), "model.onnx", "'mapping'", "subgraph", error=ModelLoadError)


def test_not_a_model_object():
    with pytest.raises(ModelLoadError, match="int"):
        load_onnx_graph(42)
