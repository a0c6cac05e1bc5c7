"""Hand-built ONNX models with If, Loop and Scan for the control-flow tests (onnx.helper, ir_version set)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper
from onnx import numpy_helper as nh

IR_VERSION = 8   # enough for opsets 11-21; onnxruntime reads at most 13


def vi(name: str, elem: int = T.FLOAT, shape=None):
    """A typed value info; ``shape`` None: rank unknown."""
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, value) -> onnx.TensorProto:
    return nh.from_array(np.asarray(value), name)


def model(nodes, inputs, outputs, initializers=(), opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "control_flow", inputs, outputs, list(initializers))
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    result.ir_version = IR_VERSION if opset < 21 else 10
    onnx.checker.check_model(result)
    return result


def _weight(shape, seed: int, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def if_model(opset: int) -> onnx.ModelProto:
    """y = If(mean(x) > 0): relu(x @ W) | MatMul(If(sum(x) > 0): x * x + u | -x, W) + bias, where W is an
    outer initializer, bias = sigmoid(b) and u = x * 2 are computed in the outer scope (u read two levels
    down)."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["xx"]),
                                    helper.make_node("Add", ["xx", "u"], ["it"])], "inner_then", [],
                                   [vi("it", shape=[2, 3])])
    inner_else = helper.make_graph([helper.make_node("Neg", ["x"], ["ie"])], "inner_else", [], [vi("ie", shape=[2, 3])])
    then = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t0"]),
                              helper.make_node("Relu", ["t0"], ["t_out"])], "then", [], [vi("t_out", shape=[2, 4])])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                               helper.make_node("Greater", ["s", "zero"], ["inner_c"]),
                               helper.make_node("If", ["inner_c"], ["e0"], then_branch=inner_then,
                                                else_branch=inner_else),
                               helper.make_node("MatMul", ["e0", "W"], ["e1"]),
                               helper.make_node("Add", ["e1", "bias"], ["e_out"])], "else", [],
                              [vi("e_out", shape=[2, 4])])
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "zero"], ["c"]),
             helper.make_node("Sigmoid", ["b"], ["bias"]),
             helper.make_node("Add", ["x", "x"], ["u"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return model(nodes, [vi("x", shape=[2, 3]), vi("b", shape=[4])], [vi("y", shape=[2, 4])],
                 [const("W", _weight((3, 4), 0)), const("zero", np.float32(0))], opset)


def loop_model(opset: int, trip: bool = True, condition: bool = True, limit: float = 3.0) -> onnx.ModelProto:
    """h_final, scans = Loop(M=6 or omitted, cond=True or omitted, h0): h = tanh(h @ W + u) with W an outer
    initializer and u = relu(x) computed outside; scan output h * i; the body's condition sum(h) < limit."""
    body = helper.make_graph([
        helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
        helper.make_node("Add", ["hw", "u"], ["hu"]),
        helper.make_node("Tanh", ["hu"], ["h_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
        helper.make_node("Mul", ["h_out", "fi"], ["scan"]),
        helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "limit"], ["c_out"]),
    ], "body", [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("h_in", shape=[2, 4])],
        [vi("c_out", T.BOOL, []), vi("h_out", shape=[2, 4]), vi("scan", shape=[2, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["u"]),
             helper.make_node("Loop", ["M" if trip else "", "c0" if condition else "", "h0"], ["h_final", "scans"],
                              body=body)]
    initializers = [const("W", _weight((4, 4), 1, 0.5)), const("M", np.int64(6)), const("c0", np.bool_(True)),
                    const("limit", np.float32(limit))]
    return model(nodes, [vi("x", shape=[2, 4]), vi("h0", shape=[2, 4])],
                 [vi("h_final", shape=[2, 4]), vi("scans", shape=["T", 2, 4])], initializers, opset)


def scan_model(opset: int) -> onnx.ModelProto:
    """Scan over a [5, 3] sequence along axis 0 (forward) and a [3, 5] one along axis 1 (reverse), one state
    (running sum), two scan outputs (one stacked on axis 1, one reversed); the body reads outer k = 2 * s."""
    body = helper.make_graph([
        helper.make_node("Add", ["state_in", "a"], ["acc"]),
        helper.make_node("Mul", ["acc", "k"], ["state_out"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Tanh", ["state_out"], ["squashed"]),
    ], "scan_body", [vi("state_in", shape=[3]), vi("a", shape=[3]), vi("b", shape=[3])],
        [vi("state_out", shape=[3]), vi("diff", shape=[3]), vi("squashed", shape=[3])])
    nodes = [helper.make_node("Add", ["s", "s"], ["k"]),
             helper.make_node("Scan", ["init", "seq_a", "seq_b"], ["final", "diffs", "squashes"], body=body,
                              num_scan_inputs=2, scan_input_axes=[0, 1], scan_input_directions=[0, 1],
                              scan_output_axes=[1, 0], scan_output_directions=[0, 1])]
    return model(nodes, [vi("init", shape=[3]), vi("seq_a", shape=[5, 3]), vi("seq_b", shape=[3, 5]),
                         vi("s", shape=[])], [vi("final", shape=[3]), vi("diffs", shape=[3, 5]),
                                             vi("squashes", shape=[5, 3])], opset=opset)


def conv_control_conv(kind: str, opset: int = 13) -> onnx.ModelProto:
    """x [N, 3, 8, 8] -> Conv -> Relu -> a; then an If (Conv+Relu | Sigmoid*a) or a Loop (3 steps of
    h = relu(conv(h) + a)) whose body reads a and its own weights; then a Conv after it -> y."""
    w_in, w_body, w_out = _weight((8, 3, 3, 3), 2), _weight((8, 8, 3, 3), 3, 0.15), _weight((4, 8, 3, 3), 4, 0.2)
    shape = ["N", 8, 8, 8]
    if kind == "If":
        then = helper.make_graph([helper.make_node("Conv", ["a", "w_body"], ["t0"], pads=[1, 1, 1, 1]),
                                  helper.make_node("Relu", ["t0"], ["t_out"])], "then", [], [vi("t_out", shape=shape)])
        other = helper.make_graph([helper.make_node("Sigmoid", ["a"], ["e0"]),
                                   helper.make_node("Mul", ["e0", "a"], ["e_out"])], "else", [],
                                  [vi("e_out", shape=shape)])
        middle = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
                  helper.make_node("Greater", ["peak", "threshold"], ["c"]),
                  helper.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other)]
    else:
        body = helper.make_graph([helper.make_node("Conv", ["h_in", "w_body"], ["h0"], pads=[1, 1, 1, 1]),
                                  helper.make_node("Add", ["h0", "a"], ["h1"]),
                                  helper.make_node("Relu", ["h1"], ["h_out"]),
                                  helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
                                 [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("h_in", shape=shape)],
                                 [vi("c_out", T.BOOL, []), vi("h_out", shape=shape)])
        middle = [helper.make_node("Loop", ["steps", "", "a"], ["b"], body=body)]
    nodes = [helper.make_node("Conv", ["x", "w_in"], ["a0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a0"], ["a"]), *middle,
             helper.make_node("Conv", ["b", "w_out"], ["y"], pads=[1, 1, 1, 1])]
    initializers = [const("w_in", w_in), const("w_body", w_body), const("w_out", w_out),
                    const("threshold", np.float32(2.5)) if kind == "If" else const("steps", np.int64(3))]
    return model(nodes, [vi("x", shape=["N", 3, 8, 8])], [vi("y", shape=["N", 4, 8, 8])], initializers, opset)
