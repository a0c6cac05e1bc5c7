"""Graph editing API: every edit keeps producer/consumer links consistent (graph.check())."""

import numpy as np
import pytest

from ppqlike.core.errors import GraphError, PPQLikeError
from ppqlike.core.ir import Graph


def _chain_graph():
    """x -> Conv(w) -> a -> Relu -> b -> Sigmoid -> y"""
    g = Graph("chain")
    x = g.create_variable("x", shape=[1, 3, 8, 8], dtype=np.float32)
    w = g.create_variable("w", value=np.ones((4, 3, 1, 1), np.float32))
    a, b, y = (g.create_variable(n) for n in "aby")
    g.inputs.append(x)
    g.outputs.append(y)
    g.create_operation("Conv", [x, w], [a], name="conv")
    g.create_operation("Relu", [a], [b], name="relu")
    g.create_operation("Sigmoid", [b], [y], name="sigmoid")
    g.check()
    return g


def test_create_and_remove_operation():
    g = _chain_graph()
    conv = g.operations["conv"]
    assert g.variables["x"].consumers == [conv] and g.variables["a"].producer is conv
    assert [v.name for v in conv.parameters] == ["w"] and [v.name for v in conv.activations] == ["x"]
    revision = g.revision
    g.remove_operation(g.operations["sigmoid"])
    g.check()
    assert g.revision > revision
    assert "sigmoid" not in g.operations and g.variables["b"].consumers == []
    assert "y" in g.variables and g.variables["y"].producer is None  # graph output is kept
    g.remove_operation(conv)
    g.check()
    assert "w" not in g.variables  # its only reader is gone
    assert "a" in g.variables  # still read by relu


def test_remove_operation_keeps_shared_parameter():
    g = _chain_graph()
    w = g.variables["w"]
    out = g.create_variable("other")
    g.create_operation("Conv", [g.variables["x"], w], [out], name="conv2")
    g.outputs.append(out)
    g.remove_operation(g.operations["conv"])
    g.check()
    assert "w" in g.variables and w.consumers == [g.operations["conv2"]]


def test_create_operation_rejects_bad_links():
    g = _chain_graph()
    with pytest.raises(GraphError, match="already produced by 'relu'"):
        g.create_operation("Relu", [g.variables["x"]], [g.variables["b"]])
    with pytest.raises(GraphError, match="already exists"):
        g.create_operation("Relu", [g.variables["x"]], [g.create_variable("c")], name="relu")
    stranger = Graph("other").create_variable("s")
    with pytest.raises(GraphError, match="not part of graph"):
        g.create_operation("Relu", [stranger], [g.create_variable("d")])
    with pytest.raises(GraphError, match="graph input"):
        g.create_operation("Relu", [g.variables["a"]], [g.variables["x"]])
    with pytest.raises(GraphError, match="parameter"):
        g.create_operation("Relu", [g.variables["a"]], [g.variables["w"]])
    e = g.create_variable("e")
    with pytest.raises(GraphError, match="twice"):
        g.create_operation("Split", [g.variables["a"]], [e, e])
    g.check()
    assert issubclass(GraphError, PPQLikeError)


def test_remove_variable():
    g = _chain_graph()
    with pytest.raises(GraphError, match="still linked"):
        g.remove_variable(g.variables["a"])
    lonely = g.create_variable("lonely")
    g.remove_variable(lonely)
    g.check()
    assert "lonely" not in g.variables


def test_insert_operation_on_all_consumers_and_graph_output():
    g = _chain_graph()
    b = g.variables["b"]
    other = g.create_variable("other")
    g.create_operation("Neg", [b], [other], name="neg")
    g.outputs.append(b)
    inserted = g.insert_operation_on_variable(b, "QuantizeLinear", name="q")
    g.check()
    new = inserted.outputs[0]
    assert b.consumers == [inserted]
    assert g.operations["sigmoid"].inputs == [new] and g.operations["neg"].inputs == [new]
    assert new in g.outputs and b not in g.outputs  # the graph output moved behind the new op
    assert new.shape == b.shape


def test_insert_operation_on_some_consumers():
    g = _chain_graph()
    b = g.variables["b"]
    other = g.create_variable("other")
    neg = g.create_operation("Neg", [b], [other], name="neg")
    g.outputs.append(b)
    scale = g.create_variable("scale", value=np.float32(0.1))
    inserted = g.insert_operation_on_variable(b, "Mul", consumers=[neg], extra_inputs=[scale])
    g.check()
    assert inserted.inputs == [b, scale]
    assert neg.inputs == [inserted.outputs[0]]
    assert g.operations["sigmoid"].inputs == [b]
    assert b in g.outputs  # not every consumer moved: the graph output stays
    with pytest.raises(GraphError, match="does not read"):
        g.insert_operation_on_variable(g.variables["a"], "Relu", consumers=[neg])
    g.check()


def test_insert_on_a_consumer_reading_twice():
    g = _chain_graph()
    a = g.variables["a"]
    twice = g.create_variable("twice")
    add = g.create_operation("Add", [a, a], [twice], name="add")
    g.insert_operation_on_variable(a, "Identity", consumers=[add])
    g.check()
    assert add.inputs[0] is add.inputs[1] is not a
    assert a.consumers.count(add) == 0


def test_replace_variable_and_replace_input():
    g = _chain_graph()
    a, b, y = g.variables["a"], g.variables["b"], g.variables["y"]
    g.outputs.append(b)
    g.replace_variable(b, a)
    g.check()
    assert g.operations["sigmoid"].inputs == [a] and a in g.outputs and b not in g.outputs
    assert b.consumers == []
    g.replace_input(g.operations["sigmoid"], 0, g.variables["x"])
    g.check()
    assert g.operations["sigmoid"].inputs == [g.variables["x"]]
    assert y.producer is g.operations["sigmoid"]


def test_replace_input_adds_an_optional_slot():
    g = _chain_graph()
    conv = g.operations["conv"]
    bias = g.create_variable("bias", value=np.zeros(4, np.float32))
    g.replace_input(conv, 2, bias)
    g.check()
    assert conv.inputs[2] is bias and bias.consumers == [conv]
    g.replace_input(conv, 4, bias)  # slots in between become omitted inputs
    g.check()
    assert conv.inputs[3] is None and bias.consumers == [conv, conv]
    g.replace_input(conv, 4, None)
    g.check()
    assert bias.consumers == [conv]


def test_rename():
    g = _chain_graph()
    a = g.variables["a"]
    g.rename_variable(a, "conv_out")
    g.rename_operation(g.operations["relu"], "activation")
    g.check()
    assert g.variables["conv_out"] is a and "a" not in g.variables
    assert g.operations["activation"].inputs == [a]
    with pytest.raises(GraphError, match="taken"):
        g.rename_variable(a, "b")
    with pytest.raises(GraphError, match="taken"):
        g.rename_operation(g.operations["conv"], "sigmoid")
    g.check()


def test_bypass_identity_on_graph_output_keeps_interface_name():
    g = _chain_graph()
    y = g.variables["y"]
    out = g.create_variable("out")
    g.outputs = [out]
    g.create_operation("Identity", [y], [out], name="identity")
    assert g.bypass_operation(g.operations["identity"]) is True
    g.check()
    assert [v.name for v in g.outputs] == ["out"]
    assert g.outputs[0].producer is g.operations["sigmoid"]
    assert "y" not in g.variables and "identity" not in g.operations


def test_bypass_identity_whose_input_is_a_graph_output_keeps_names():
    # y is a graph output and also feeds an Identity read by another op: y keeps its name.
    g = _chain_graph()
    y = g.variables["y"]
    copy, neg_out = g.create_variable("copy"), g.create_variable("neg_out")
    g.create_operation("Identity", [y], [copy], name="identity")
    g.create_operation("Neg", [copy], [neg_out], name="neg")
    g.outputs.append(neg_out)
    assert g.bypass_operation(g.operations["identity"]) is True
    g.check()
    assert [v.name for v in g.outputs] == ["y", "neg_out"]
    assert g.operations["neg"].inputs == [y]


def test_bypass_dropout_with_unused_mask():
    g = _chain_graph()
    b = g.variables["b"]
    ratio = g.create_variable("ratio", value=np.float32(0.5))
    dropped, mask = g.create_variable("dropped"), g.create_variable("mask")
    g.create_operation("Dropout", [b, ratio], [dropped, mask], name="dropout")
    g.replace_input(g.operations["sigmoid"], 0, dropped)
    g.check()
    assert g.bypass_operation(g.operations["dropout"]) is True
    g.check()
    assert g.operations["sigmoid"].inputs == [b]
    assert "dropped" not in g.variables and "mask" not in g.variables


def test_bypass_dropout_with_used_mask_is_kept():
    g = _chain_graph()
    b = g.variables["b"]
    dropped, mask = g.create_variable("dropped"), g.create_variable("mask")
    g.create_operation("Dropout", [b], [dropped, mask], name="dropout")
    g.outputs.append(mask)
    assert g.bypass_operation(g.operations["dropout"]) is False
    g.check()
    assert "dropout" in g.operations


def test_bypass_identity_from_graph_input_to_graph_output_is_kept():
    g = Graph("passthrough")
    x, y = g.create_variable("x"), g.create_variable("y")
    g.inputs.append(x)
    g.outputs.append(y)
    g.create_operation("Identity", [x], [y], name="identity")
    assert g.bypass_operation(g.operations["identity"]) is False
    g.check()
    assert [v.name for v in g.inputs] == ["x"] and [v.name for v in g.outputs] == ["y"]


def test_bypass_identity_from_graph_input_to_inner_op():
    g = _chain_graph()
    x = g.variables["x"]
    copy = g.create_variable("x_copy")
    g.create_operation("Identity", [x], [copy], name="identity")
    g.replace_input(g.operations["conv"], 0, copy)
    assert g.bypass_operation(g.operations["identity"]) is True
    g.check()
    assert g.operations["conv"].inputs[0] is x and [v.name for v in g.inputs] == ["x"]


def test_topological_sort_respects_edges():
    g = Graph("dag")
    x = g.create_variable("x")
    g.inputs.append(x)
    # Create ops in reverse order of dependence: the sort must reorder them.
    c, b, a = g.create_variable("c"), g.create_variable("b"), g.create_variable("a")
    g.create_operation("Add", [a, b], [c], name="last")
    g.create_operation("Neg", [a], [b], name="middle")
    g.create_operation("Relu", [x], [a], name="first")
    g.outputs.append(c)
    order = [op.name for op in g.topological_sort()]
    assert order == ["first", "middle", "last"]
    for operation in g.topological_sort():
        for variable in operation.inputs:
            if variable.producer is not None:
                assert order.index(variable.producer.name) < order.index(operation.name)
    assert [op.name for op in g] == order


def test_cycle_raises_graph_error_naming_ops():
    g = Graph("loop")
    x, a, b = g.create_variable("x"), g.create_variable("a"), g.create_variable("b")
    g.inputs.append(x)
    g.create_operation("Add", [x, b], [a], name="op_add")
    g.create_operation("Relu", [a], [b], name="op_relu")
    g.check()  # links are consistent, only the order is impossible
    with pytest.raises(GraphError, match="cycle") as info:
        g.topological_sort()
    assert "op_add" in str(info.value) and "op_relu" in str(info.value)


def _two_conv_relu_chains():
    """x -> conv1 -> relu1 -> conv2 -> relu2 -> y; conv2's output is also a graph output."""
    g = Graph("convs")
    x = g.create_variable("x")
    g.inputs.append(x)
    w = g.create_variable("w", value=np.ones((3, 3, 1, 1), np.float32))
    names = ["c1", "r1", "c2", "r2"]
    outs = [g.create_variable(n) for n in names]
    g.create_operation("Conv", [x, w], [outs[0]], name="conv1")
    g.create_operation("Relu", [outs[0]], [outs[1]], name="relu1")
    g.create_operation("Conv", [outs[1], w], [outs[2]], name="conv2")
    g.create_operation("Relu", [outs[2]], [outs[3]], name="relu2")
    g.outputs.append(outs[3])
    return g


def test_find_chains_conv_relu():
    g = _two_conv_relu_chains()
    chains = g.find_chains(["Conv", "Relu"])
    assert [[op.name for op in chain] for chain in chains] == [["conv1", "relu1"], ["conv2", "relu2"]]
    chains = g.find_chains(["Conv", lambda op: op.type == "Relu", "Conv"])
    assert [[op.name for op in chain] for chain in chains] == [["conv1", "relu1", "conv2"]]


def test_find_chains_exclusive_excludes_conv_with_two_readers():
    g = _two_conv_relu_chains()
    extra = g.create_variable("extra")
    g.create_operation("Sigmoid", [g.variables["c2"]], [extra], name="second_reader")
    g.outputs.append(extra)
    assert [[op.name for op in c] for c in g.find_chains(["Conv", "Relu"])] == [["conv1", "relu1"]]
    assert len(g.find_chains(["Conv", "Relu"], exclusive=False)) == 2
    # A conv output that is also a graph output cannot be fused either.
    g.outputs.append(g.variables["c1"])
    assert g.find_chains(["Conv", "Relu"]) == []


def test_descendants_and_ancestors():
    g = _two_conv_relu_chains()
    ops = g.operations
    assert {op.name for op in g.descendants(ops["relu1"])} == {"conv2", "relu2"}
    assert {op.name for op in g.ancestors(ops["conv2"])} == {"conv1", "relu1"}
    assert g.descendants(ops["relu2"]) == set() and g.ancestors(ops["conv1"]) == set()


def test_input_dependent_operations():
    """Ops reached from a graph input, through any path, depend on it; ops of parameters and constants
    alone (a ConstantOfShape of a parameter, an op without inputs) do not, even when they feed the others."""
    g = _two_conv_relu_chains()
    shape = g.create_variable("shape", value=np.array([2], np.int64))
    zeros, widths, padded = g.create_variable("zeros"), g.create_variable("widths"), g.create_variable("padded")
    g.create_operation("ConstantOfShape", [shape], [zeros], name="zeros_op")
    g.create_operation("Constant", [], [widths], name="constant_op", attributes={"value": np.zeros(8, np.int64)})
    g.create_operation("Pad", [g.variables["r2"], widths], [padded], name="pad")
    g.outputs.append(padded)
    assert g.input_dependent() == {"conv1", "relu1", "conv2", "relu2", "pad"}


def test_check_detects_broken_links():
    g = _chain_graph()
    g.variables["a"].consumers.append(g.operations["sigmoid"])  # a bypassed edit
    with pytest.raises(GraphError):
        g.check()
    g = _chain_graph()
    g.operations["relu"].inputs.append(g.variables["x"])
    with pytest.raises(GraphError, match="relu"):
        g.check()


def test_unique_name():
    g = _chain_graph()
    assert g.unique_name("fresh") == "fresh"
    assert g.unique_name("a") == "a_1"
    assert g.unique_name("conv") == "conv_1"
