"""Sequence ops (SequenceEmpty/Construct/Insert/At/Erase/Length, SplitToSequence, ConcatFromSequence)
against onnxruntime, alone and carried through a Loop; sequences are Python lists of arrays."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from control_flow_models import const, model, vi
from onnx_helpers import run_onnxruntime
from ppqlike.core.errors import ExecutionError
from ppqlike.executor import NumpyExecutor
from ppqlike.io import load_onnx_graph

OPSETS = [11, 13, 16, 19, 21]


def seq(name: str, shape=None):
    return helper.make_tensor_sequence_value_info(name, T.FLOAT, shape)


def run_both(onnx_model, feeds):
    expected = run_onnxruntime(onnx_model, feeds)
    got = NumpyExecutor(load_onnx_graph(onnx_model)).forward(feeds)
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        if isinstance(want, list):
            assert isinstance(value, list) and len(value) == len(want)
            for item, wanted in zip(value, want):
                np.testing.assert_allclose(item, wanted, rtol=1e-6)
                assert item.shape == wanted.shape
        else:
            assert np.shape(value) == np.shape(want)
            np.testing.assert_allclose(value, want, rtol=1e-6)
    return got


def arrays(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("insert_at, erase_at, read_at", [(None, None, 0), (1, -1, -2), (-1, 0, 2), (3, 2, -1)])
def test_construct_insert_erase_at_length(opset, insert_at, erase_at, read_at):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "d"] + ([] if insert_at is None else ["pi"]), ["s1"]),
             helper.make_node("SequenceErase", ["s1"] + ([] if erase_at is None else ["pe"]), ["s2"]),
             helper.make_node("SequenceAt", ["s2", "pa"], ["item"]),
             helper.make_node("SequenceLength", ["s2"], ["length"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["joined"], axis=0)]
    initializers = [const("pa", np.int64(read_at))]
    initializers += [] if insert_at is None else [const("pi", np.int64(insert_at))]
    initializers += [] if erase_at is None else [const("pe", np.int32(erase_at))]
    onnx_model = model(nodes, [vi(n, shape=[2, 3]) for n in "abcd"],
                       [vi("item", shape=[2, 3]), vi("length", T.INT64, []), vi("joined", shape=[6, 3]),
                        seq("s2")], initializers, opset)
    feeds = dict(zip("abcd", arrays(0, *[(2, 3)] * 4)))
    run_both(onnx_model, feeds)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("split, axis, keepdims", [(None, 0, 1), (None, 1, 0), (None, -1, 0), (np.int64(2), 1, 1),
                                                   (np.array([1, 3, 1], np.int64), -1, 1), (np.int64(5), 0, 1)])
@pytest.mark.parametrize("new_axis, concat_axis", [(0, 0), (1, -1), (1, 0)])
def test_split_to_sequence_and_concat_back(opset, split, axis, keepdims, new_axis, concat_axis):
    inputs = ["x"] + ([] if split is None else ["split"])
    nodes = [helper.make_node("SplitToSequence", inputs, ["pieces"], axis=axis, keepdims=keepdims),
             helper.make_node("ConcatFromSequence", ["pieces"], ["y"], axis=concat_axis, new_axis=new_axis)]
    rank = 2 + new_axis
    onnx_model = model(nodes, [vi("x", shape=[4, 5])], [seq("pieces"), vi("y", shape=[f"d{i}" for i in range(rank)])],
                       [] if split is None else [const("split", split)], opset)
    try:
        expected = run_onnxruntime(onnx_model, {"x": arrays(1, (4, 5))[0]})
    except Exception:   # a piece shape the concatenation cannot take: onnxruntime refuses, so must we
        with pytest.raises(ExecutionError):
            NumpyExecutor(load_onnx_graph(onnx_model)).forward({"x": arrays(1, (4, 5))[0]})
        return
    assert expected
    run_both(onnx_model, {"x": arrays(1, (4, 5))[0]})


@pytest.mark.parametrize("opset", [13, 16, 19, 21])
def test_sequence_carried_through_a_loop(opset):
    """The usual export of a Python list appended to in a loop: SequenceEmpty, SequenceInsert in the body."""
    body = helper.make_graph([helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
                              helper.make_node("Mul", ["x", "fi"], ["row"]),
                              helper.make_node("SequenceInsert", ["rows_in", "row"], ["rows_out"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
                             [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), seq("rows_in")],
                             [vi("c_out", T.BOOL, []), seq("rows_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=T.FLOAT),
             helper.make_node("Loop", ["M", "", "empty"], ["rows"], body=body),
             helper.make_node("ConcatFromSequence", ["rows"], ["y"], axis=0, new_axis=1)]
    onnx_model = model(nodes, [vi("x", shape=[3])], [vi("y", shape=[4, 3])], [const("M", np.int64(4))], opset)
    run_both(onnx_model, {"x": arrays(2, (3,))[0]})


def test_out_of_range_positions_are_execution_errors():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    onnx_model = model(nodes, [vi("a", shape=[2]), vi("b", shape=[2])], [vi("y", shape=[2])],
                       [const("p", np.int64(2))], 13)
    with pytest.raises(ExecutionError, match="position 2 is out of range for a sequence of 2"):
        NumpyExecutor(load_onnx_graph(onnx_model)).forward(dict(zip("ab", arrays(3, (2,), (2,)))))


@pytest.mark.parametrize("opset", [17, 18, 21])
@pytest.mark.parametrize("extra", ["sequence", "tensor"])
def test_sequence_map_runs_its_body_per_element(opset, extra):
    """SequenceMap: the body reads element i of each sequence input (or the whole tensor input) and a value
    of the enclosing scope; each body output is collected into an output sequence."""
    body = helper.make_graph([helper.make_node("Mul", ["item", "other"], ["scaled"]),
                              helper.make_node("Add", ["scaled", "bias"], ["shifted"]),
                              helper.make_node("ReduceSum", ["shifted"], ["total"], keepdims=0)], "body",
                             [vi("item", shape=None), vi("other", shape=None)],
                             [vi("shifted", shape=None), vi("total", shape=None)])
    nodes = [helper.make_node("SplitToSequence", ["x"], ["items"], axis=0, keepdims=0),
             helper.make_node("Neg", ["w"], ["bias"])]
    if extra == "sequence":
        nodes.append(helper.make_node("SplitToSequence", ["z"], ["others"], axis=0, keepdims=0))
    nodes += [helper.make_node("SequenceMap", ["items", "others" if extra == "sequence" else "z"],
                               ["mapped", "totals"], body=body),
              helper.make_node("ConcatFromSequence", ["mapped"], ["y"], axis=0, new_axis=1)]
    z_shape = [4, 3] if extra == "sequence" else [3]
    onnx_model = model(nodes, [vi("x", shape=[4, 3]), vi("z", shape=z_shape)], [vi("y", shape=[4, 3]), seq("totals")],
                       [const("w", np.float32([0.5, -1.0, 2.0]))], opset)
    x, z = arrays(4, (4, 3), tuple(z_shape))
    run_both(onnx_model, {"x": x, "z": z})


@pytest.mark.parametrize("opset", [15, 18, 21])
@pytest.mark.parametrize("filled", [True, False])
def test_optional_has_and_get_element(opset, filled):
    """Optional wraps a tensor (or nothing); OptionalHasElement says which; an If takes the element or a
    default, as exporters write a None-able argument."""
    then_branch = helper.make_graph([helper.make_node("OptionalGetElement", ["maybe"], ["got"])], "then", [],
                                    [vi("got", shape=[3])])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["fallback"])], "else", [],
                                    [vi("fallback", shape=[3])])
    nodes = [helper.make_node("Optional", ["x2"] if filled else [], ["maybe"],
                              **({} if filled else {"type": helper.make_tensor_type_proto(T.FLOAT, [3])})),
             helper.make_node("OptionalHasElement", ["maybe"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    if filled:
        nodes.insert(0, helper.make_node("Mul", ["x", "x"], ["x2"]))
    onnx_model = model(nodes, [vi("x", shape=[3])], [vi("y", shape=[3]), vi("has", T.BOOL, [])], [], opset)
    got = run_both(onnx_model, {"x": arrays(5, (3,))[0]})
    assert bool(got[1]) is filled


def test_getting_the_element_of_an_empty_optional_is_an_execution_error():
    nodes = [helper.make_node("Optional", [], ["maybe"], type=helper.make_tensor_type_proto(T.FLOAT, [3])),
             helper.make_node("OptionalGetElement", ["maybe"], ["y"]),
             helper.make_node("Add", ["y", "x"], ["z"])]
    onnx_model = model(nodes, [vi("x", shape=[3])], [vi("z", shape=[3])], [], 18)
    with pytest.raises(ExecutionError, match="the optional is empty"):
        NumpyExecutor(load_onnx_graph(onnx_model)).forward({"x": arrays(6, (3,))[0]})
