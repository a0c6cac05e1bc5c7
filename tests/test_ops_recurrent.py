"""LSTM, GRU and RNN against onnxruntime on generated inputs, every attribute.

onnxruntime's CPU kernels run every direction, activation (with alpha/beta),
clip, input_forget, linear_before_reset, peephole, sequence_lens and initial
state the ONNX text allows, but refuse ``layout=1`` (batch first).  A
layout-1 node is therefore compared with onnxruntime running the same node
at layout 0 on the transposed inputs (the ONNX text defines layout 1 as that
transposition), and, for the default activations, with onnx's reference
evaluator running the layout-1 node itself.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx.reference import ReferenceEvaluator

import ppqlike
from ppqlike.core.errors import ExecutionError, UnsupportedOperationError
from onnx_helpers import run_executor, run_onnxruntime, single_node_model

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
PER_DIRECTION = {"LSTM": 3, "GRU": 2, "RNN": 1}
ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
               "Elu", "Softsign", "Softplus"]
PARAMETERS = {"W", "R", "B", "P"}
RTOL = 1e-4
OVERFLOW = 1e30   # magnitudes past it count as overflowed (exploding states; see _assert_close)


def recurrent_case(op_type, steps=5, batch=3, size=4, hidden=6, direction="forward", seed=0, bias=True,
                   lengths=None, initial_h=False, initial_c=False, peepholes=False, layout=0, **attributes):
    """(inputs, attributes) of one recurrent node; None marks an omitted optional input."""
    directions = 2 if direction == "bidirectional" else 1
    rows, scale = GATES[op_type] * hidden, 1 / np.sqrt(hidden)
    rng = np.random.default_rng(seed)

    def normal(*shape, factor=1.0):
        return (rng.standard_normal(shape) * factor).astype(np.float32)

    state = (directions, batch, hidden) if layout == 0 else (batch, directions, hidden)
    inputs = {"X": normal(steps, batch, size) if layout == 0 else normal(batch, steps, size),
              "W": normal(directions, rows, size, factor=scale), "R": normal(directions, rows, hidden, factor=scale),
              "B": normal(directions, 2 * rows, factor=scale) if bias else None,
              "sequence_lens": None if lengths is None else np.asarray(lengths, dtype=np.int32),
              "initial_h": normal(*state) if initial_h else None}
    if op_type == "LSTM":
        inputs["initial_c"] = normal(*state) if initial_c else None
        inputs["P"] = normal(directions, 3 * hidden, factor=scale) if peepholes else None
    while inputs and inputs[list(inputs)[-1]] is None:
        inputs.pop(list(inputs)[-1])
    attributes = dict(hidden_size=hidden, direction=direction, **attributes)
    if layout:
        attributes["layout"] = layout
    return inputs, attributes


def _model(op_type, inputs, attributes, n_outputs, opset=14):
    return single_node_model(op_type, inputs, attributes, initializers=PARAMETERS, n_outputs=n_outputs, opset=opset)


def _feeds(inputs):
    return {k: v for k, v in inputs.items() if v is not None and k not in PARAMETERS}


def _assert_close(got, want, what):
    """Equal to RTOL relative (absolute floor: RTOL / 10 of the output's peak, or of 0.1 where the peak is
    smaller: the gates sum terms of order 1 in float32, and where they cancel to an output of 1e-4 the two
    summation orders differ by a few 1e-8: hypothesis found 3.8e-8 on an LSTM with Relu gates).  Unbounded
    activations can overflow (Softplus as a GRU's update gate makes 1 - z negative): then both must overflow,
    past ``OVERFLOW`` (hypothesis found onnxruntime at float32's largest value where the executor reached inf),
    and the values both keep finite must agree (where inf - inf gives nan depends on the order of the sums)."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    with np.errstate(invalid="ignore"):   # (nan compares False: overflowed)
        kept_g, kept_w = np.abs(got) < OVERFLOW, np.abs(want) < OVERFLOW
    assert kept_g.all() == kept_w.all(), f"{what}: only one side overflows"
    finite = kept_g & kept_w
    got, want = got[finite], want[finite]
    peak = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * 0.1 * max(peak, 0.1), err_msg=what)


def _reference_outputs(op_type, inputs, attributes, n_outputs, opset):
    """onnxruntime's outputs; for layout 1, its layout-0 run on the transposed inputs, transposed back."""
    if not attributes.get("layout"):
        model = _model(op_type, inputs, attributes, n_outputs, opset)
        return run_onnxruntime(model, _feeds(inputs))
    moved = {name: (None if value is None else
                    value.transpose(1, 0, 2) if name in ("X", "initial_h", "initial_c") else value)
             for name, value in inputs.items()}
    flat = {k: v for k, v in attributes.items() if k != "layout"}
    outputs = run_onnxruntime(_model(op_type, moved, flat, n_outputs, opset), _feeds(moved))
    return [outputs[0].transpose(2, 0, 1, 3)] + [value.transpose(1, 0, 2) for value in outputs[1:]]


def assert_recurrent_matches(op_type, inputs, attributes, n_outputs=None, opset=14):
    n_outputs = n_outputs or (3 if op_type == "LSTM" else 2)
    want = _reference_outputs(op_type, inputs, attributes, n_outputs, opset)
    got = run_executor(_model(op_type, inputs, attributes, n_outputs, opset), _feeds(inputs))
    assert len(got) == len(want) == n_outputs
    for index, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w, f"{op_type} {attributes} output {index}")
    return got


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions_with_every_optional_input(op_type, direction):
    inputs, attributes = recurrent_case(op_type, direction=direction, lengths=[5, 2, 4], initial_h=True,
                                        initial_c=True, peepholes=True, seed=1)
    assert_recurrent_matches(op_type, inputs, attributes)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_defaults_without_optional_inputs(op_type):
    inputs, attributes = recurrent_case(op_type, bias=False)
    assert_recurrent_matches(op_type, inputs, attributes)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_in_every_slot(op_type, activation):
    for slot in range(PER_DIRECTION[op_type]):
        names = ["Sigmoid", "Tanh", "Tanh"][:PER_DIRECTION[op_type]] if op_type != "RNN" else ["Tanh"]
        names[slot] = activation
        inputs, attributes = recurrent_case(op_type, direction="bidirectional", seed=slot, initial_h=True,
                                            activations=names + names[::-1], activation_alpha=[0.3, 0.7, 0.4],
                                            activation_beta=[0.6, 0.2])
        assert_recurrent_matches(op_type, inputs, attributes)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("activation", ["Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"])
def test_activation_defaults_without_alpha_or_beta(op_type, activation):
    # onnxruntime's defaults: LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1.0, others 0 (see _recurrent_activations)
    names = {"LSTM": [activation, "Tanh", activation], "GRU": ["Sigmoid", activation], "RNN": [activation]}[op_type]
    inputs, attributes = recurrent_case(op_type, activations=names, seed=4)
    assert_recurrent_matches(op_type, inputs, attributes)


def test_clip_input_forget_and_linear_before_reset():
    for op_type, extra in [("LSTM", {"clip": 0.4}), ("LSTM", {"input_forget": 1}), ("GRU", {"clip": 0.3}),
                           ("GRU", {"linear_before_reset": 1}), ("GRU", {"linear_before_reset": 1, "clip": 0.5}),
                           ("RNN", {"clip": 0.25})]:
        inputs, attributes = recurrent_case(op_type, direction="bidirectional", lengths=[1, 5, 3], initial_h=True,
                                            peepholes=True, seed=2, **extra)
        assert_recurrent_matches(op_type, inputs, attributes)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_zero_length_sequence_gives_zero_states(op_type):
    inputs, attributes = recurrent_case(op_type, direction="bidirectional", lengths=[0, 5, 2], initial_h=True,
                                        initial_c=True, seed=3)
    outputs = assert_recurrent_matches(op_type, inputs, attributes)
    assert not np.any(outputs[0][:, :, 0]) and not np.any(outputs[1][:, 0])
    assert np.all(outputs[0][2:, :, 2] == 0)   # past the length of sequence 2: zeros in Y


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_omitted_outputs(op_type):
    inputs, attributes = recurrent_case(op_type, direction="reverse", lengths=[3, 5, 1])
    assert_recurrent_matches(op_type, inputs, attributes, n_outputs=1)
    node_outputs = ["", "Y_h"]
    model = _model(op_type, inputs, attributes, 2)
    model.graph.node[0].output[:] = node_outputs
    model.graph.output.pop(0)
    model.graph.output[0].name = "Y_h"
    want = run_onnxruntime(model, _feeds(inputs))
    got = run_executor(model, _feeds(inputs))
    _assert_close(got[0], want[0], f"{op_type} Y_h alone")


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("opset", [11, 13, 21])
def test_opsets(op_type, opset):
    inputs, attributes = recurrent_case(op_type, direction="bidirectional", lengths=[4, 5, 1], initial_h=True,
                                        seed=opset)
    assert_recurrent_matches(op_type, inputs, attributes, opset=opset)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_batch_first_layout_against_reference_evaluator(op_type, direction):
    # onnxruntime refuses layout=1; onnx's reference evaluator runs it (default activations, no sequence_lens)
    inputs, attributes = recurrent_case(op_type, direction=direction, layout=1, initial_h=True, initial_c=True,
                                        seed=5, **({"linear_before_reset": 1} if op_type == "GRU" else {}))
    n_outputs = 3 if op_type == "LSTM" else 2
    model = _model(op_type, inputs, attributes, n_outputs)
    want = ReferenceEvaluator(model).run(None, _feeds(inputs))
    got = run_executor(model, _feeds(inputs))
    for index, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w.astype(np.float32), f"{op_type} layout 1 output {index}")
    assert_recurrent_matches(op_type, inputs, attributes)   # and onnxruntime at layout 0, transposed


@st.composite
def recurrent_cases(draw):
    op_type = draw(st.sampled_from(["LSTM", "GRU", "RNN"]))
    steps, batch = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    directions = 2 if direction == "bidirectional" else 1
    lengths = draw(st.none() | st.lists(st.integers(0, steps), min_size=batch, max_size=batch))
    extra = {}
    if draw(st.booleans()):
        extra["activations"] = draw(st.lists(st.sampled_from(ACTIVATIONS), min_size=PER_DIRECTION[op_type] * directions,
                                             max_size=PER_DIRECTION[op_type] * directions))
        floats = st.floats(0.0625, 1.5, width=32)
        for name in ("activation_alpha", "activation_beta"):
            values = draw(st.lists(floats, max_size=6))
            if values:   # an empty list is the attribute left out
                extra[name] = values
    if draw(st.booleans()):
        extra["clip"] = draw(st.floats(0.125, 3.0, width=32))
    if op_type == "LSTM" and draw(st.booleans()):
        extra["input_forget"] = 1
    if op_type == "GRU" and draw(st.booleans()):
        extra["linear_before_reset"] = 1
    return recurrent_case(
        op_type, steps=steps, batch=batch, size=draw(st.integers(1, 5)), hidden=draw(st.integers(1, 6)),
        direction=direction, seed=draw(st.integers(0, 2 ** 16)), bias=draw(st.booleans()), lengths=lengths,
        initial_h=draw(st.booleans()), initial_c=draw(st.booleans()), peepholes=draw(st.booleans()),
        layout=draw(st.sampled_from([0, 1])), **extra), op_type


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recurrent_cases())
def test_generated_cases_match_onnxruntime(case):
    (inputs, attributes), op_type = case
    assert_recurrent_matches(op_type, inputs, attributes)


def test_wrong_activation_count_and_name_are_refused():
    inputs, attributes = recurrent_case("LSTM", activations=["Sigmoid", "Tanh"])
    with pytest.raises(UnsupportedOperationError, match="2 activations for 1 direction"):
        run_executor(_model("LSTM", inputs, attributes, 1), _feeds(inputs))
    inputs, attributes = recurrent_case("GRU", activations=["Sigmoid", "Swish"])
    with pytest.raises(UnsupportedOperationError, match="'Swish'"):
        run_executor(_model("GRU", inputs, attributes, 1), _feeds(inputs))


def test_bad_sequence_lens_and_state_shapes_name_the_node():
    inputs, attributes = recurrent_case("GRU", lengths=[1, 6, 2])
    graph = ppqlike.load_onnx_graph(_model("GRU", {**inputs, "sequence_lens": np.array([1, 2, 3], np.int32)},
                                           attributes, 2))
    with pytest.raises(ExecutionError, match=r"gru_node.*sequence_lens \[1, 6, 2\]"):
        ppqlike.NumpyExecutor(graph).forward(_feeds(inputs))
    inputs, attributes = recurrent_case("LSTM", initial_h=True, hidden=6)
    inputs["R"] = inputs["R"][:, :, :5]   # [1, 24, 5] where hidden_size 6 needs [1, 24, 6]
    graph = ppqlike.load_onnx_graph(_model("LSTM", inputs, attributes, 3))
    with pytest.raises(ExecutionError, match=r"lstm_node.*input R has shape \[1, 24, 5\], expected \[1, 24, 6\]"):
        ppqlike.NumpyExecutor(graph).forward(_feeds(inputs))
