"""Helpers for tests: build single-node ONNX models and compare the executor with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper

import ppqlike

IR_VERSION = 10  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 writes 14 by default


def make_model(nodes, inputs, outputs, initializers=(), opset=13, value_info=()):
    """A ModelProto with ``ir_version`` set so that onnxruntime can read it."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    return model


def single_node_model(op_type, inputs, attributes=None, initializers=None, n_outputs=1, opset=13,
                      output_types=None, infer_with_reference=False):
    """A model of one node.

    ``inputs`` maps input names to example arrays: names in ``initializers``
    (a set of names) become initializers holding that array, the others graph
    inputs.  ``None`` as a name's value means an omitted optional input.
    """
    initializers = set(initializers or ())
    graph_inputs, inits, names = [], [], []
    for name, array in inputs.items():
        if array is None:
            names.append("")
            continue
        names.append(name)
        array = np.asarray(array)
        if name in initializers:
            inits.append(onnx.numpy_helper.from_array(array, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
    output_names = [f"y{i}" for i in range(n_outputs)]
    outputs = [helper.make_tensor_value_info(n, (output_types or {}).get(n, 0), None) for n in output_names]
    node = helper.make_node(op_type, names, output_names, name=f"{op_type.lower()}_node", **(attributes or {}))
    model = make_model([node], graph_inputs, outputs, inits, opset=opset)
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for output in model.graph.output:
        inferred_type = known.get(output.name)
        if inferred_type is not None and inferred_type.tensor_type.elem_type:
            output.type.CopyFrom(inferred_type)
        if not output.type.tensor_type.elem_type:
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    # Outputs whose shape inference could not tell get their rank from a real run.
    if any(not o.type.tensor_type.HasField("shape") for o in model.graph.output):
        feeds = {i.name: np.asarray(inputs[i.name]) for i in model.graph.input}
        run = run_reference if infer_with_reference else run_onnxruntime
        for output, value in zip(model.graph.output, run(model, feeds)):
            if not output.type.tensor_type.HasField("shape"):
                output.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)
                shape = output.type.tensor_type.shape
                for axis in range(value.ndim):
                    shape.dim.add().dim_param = f"{output.name}_d{axis}"
    return model


def run_onnxruntime(model, feeds):
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle spinning slows numpy next to it
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_executor_matches_file(model, feed, rtol=1e-4, atol_fraction=1e-5):
    """The executor runs ``model`` (a loaded real model) on ``feed`` as onnxruntime does: relative ``rtol``,
    absolute ``atol_fraction`` of each output's largest magnitude."""
    expected = run_onnxruntime(model, feed)
    got = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).forward(feed)
    for value, want in zip(got, expected):
        assert value.shape == want.shape
        np.testing.assert_allclose(value, want, rtol=rtol, atol=atol_fraction * float(np.max(np.abs(want))))


def run_executor(model, feeds, output_names=None, checked=True):
    """The executor's outputs for ``model``; ``checked=False`` skips the importer's checks (onnx.checker
    refuses ops deprecated in their own opset, such as GroupNormalization-18, which onnxruntime runs)."""
    if checked:
        graph = ppqlike.load_onnx_graph(model)
    else:
        from ppqlike.io.onnx_import import graph_from_model
        graph = graph_from_model(model, "the test model")
    return ppqlike.NumpyExecutor(graph).forward(feeds, output_names=output_names)


def run_reference(model, feeds):
    """The outputs of onnx's ReferenceEvaluator, for what onnxruntime's CPU kernels lack."""
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def assert_matches_onnxruntime(op_type, inputs, attributes=None, initializers=None, n_outputs=1,
                               opset=13, rtol=1e-5, atol=1e-6, exact=False, checked=True, reference=False):
    """Run one node in onnxruntime and in the executor and compare every output.

    Shapes and dtypes must agree; values within ``rtol``/``atol`` (or exactly).
    ``reference=True`` compares with onnx's ReferenceEvaluator instead (where onnxruntime's CPU
    provider lacks the op or an attribute value); ``checked``: see :func:`run_executor`.
    Returns the executor's outputs.
    """
    model = single_node_model(op_type, inputs, attributes, initializers, n_outputs, opset,
                              infer_with_reference=reference)
    initializers = set(initializers or ())
    feeds = {k: np.asarray(v) for k, v in inputs.items() if v is not None and k not in initializers}
    expected = run_reference(model, feeds) if reference else run_onnxruntime(model, feeds)
    actual = run_executor(model, feeds, checked=checked)
    assert len(actual) == len(expected)
    for index, (got, want) in enumerate(zip(actual, expected)):
        assert got.shape == want.shape, f"{op_type} output {index}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{op_type} output {index}: dtype {got.dtype} != {want.dtype}"
        if exact or not np.issubdtype(want.dtype, np.floating):
            np.testing.assert_array_equal(got, want, err_msg=f"{op_type} output {index}")
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op_type} output {index}")
    return actual


def fused_kernels_are_exact(model) -> bool:
    """Whether onnxruntime's fused integer kernels compute ``model`` exactly on this CPU."""
    from ppqlike.io.import_quantized import fused_kernels_exact
    return fused_kernels_exact(model)
