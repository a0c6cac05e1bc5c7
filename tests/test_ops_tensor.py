"""Tensor (layout) kernels against onnxruntime."""

import numpy as np
import pytest
from onnx_helpers import assert_matches_onnxruntime as check
from ppqlike.core.errors import UnsupportedOperationError
from ppqlike.core.ir import Graph, Operation
from ppqlike.executor.ops import build_kernel, tensor

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
INT_MAX = np.iinfo(np.int64).max
I64 = np.int64


def ints(*values):
    return np.array(values, dtype=I64)


# ------------------------------------------------------------------ Reshape --
@pytest.mark.parametrize("shape", [(6, 20), (0, -1), (-1, 5), (2, 0, 0, 5), (120,), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("static", [True, False])
def test_reshape(shape, static):
    check("Reshape", {"x": X, "s": ints(*shape)}, initializers={"s"} if static else None, exact=True)


def test_reshape_allowzero():
    data = np.zeros((0, 3), np.float32)
    check("Reshape", {"x": data, "s": ints(3, 0)}, {"allowzero": 1}, initializers={"s"}, opset=14)
    check("Reshape", {"x": X, "s": ints(0, 12, -1)}, {"allowzero": 0}, initializers={"s"}, opset=14)


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -4])
def test_flatten(axis):
    check("Flatten", {"x": X}, {"axis": axis}, exact=True)


def test_flatten_default():
    check("Flatten", {"x": X}, exact=True, opset=11)


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm):
    check("Transpose", {"x": X}, None if perm is None else {"perm": perm}, exact=True)


# -------------------------------------------------------- Squeeze/Unsqueeze --
SQ = RNG.standard_normal((1, 3, 1, 4, 1)).astype(np.float32)


@pytest.mark.parametrize("axes", [None, [0], [-1, 2], [0, 2, 4]])
def test_squeeze_attribute_opset11(axes):
    check("Squeeze", {"x": SQ}, None if axes is None else {"axes": axes}, opset=11, exact=True)


@pytest.mark.parametrize("axes", [None, [0], [-1, 2]])
@pytest.mark.parametrize("static", [True, False])
def test_squeeze_input_opset13(axes, static):
    inputs = {"x": SQ} if axes is None else {"x": SQ, "a": ints(*axes)}
    check("Squeeze", inputs, initializers={"a"} if static else None, opset=13, exact=True)


@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [1, -1, 0]])
def test_unsqueeze_attribute_opset12(axes):
    check("Unsqueeze", {"x": X[0, 0]}, {"axes": axes}, opset=12, exact=True)


@pytest.mark.parametrize("axes", [[0], [-1], [1, -1, 0]])
@pytest.mark.parametrize("static", [True, False])
def test_unsqueeze_input_opset13(axes, static):
    check("Unsqueeze", {"x": X[0, 0], "a": ints(*axes)}, initializers={"a"} if static else None,
          opset=13, exact=True)


def test_unsqueeze_scalar():
    check("Unsqueeze", {"x": np.array(3, I64), "a": ints(0)}, initializers={"a"}, opset=13)


# ------------------------------------------------------------ Concat/Split --
@pytest.mark.parametrize("axis", [0, 2, -1])
def test_concat(axis):
    other = RNG.standard_normal([4 if i == axis % 4 else d for i, d in enumerate(X.shape)]).astype(np.float32)
    check("Concat", {"a": X, "b": other, "c": X}, {"axis": axis}, exact=True)


def test_concat_ints():
    check("Concat", {"a": ints(1, 2), "b": ints(3), "c": ints()}, {"axis": 0}, opset=11)


@pytest.mark.parametrize("axis,split", [(1, [1, 2]), (-1, [2, 0, 3]), (3, None)])
def test_split_attribute_opset11(axis, split):
    count = 5 if split is None else len(split)
    attributes = {"axis": axis} if split is None else {"axis": axis, "split": split}
    check("Split", {"x": X}, attributes, n_outputs=count, opset=11, exact=True)


@pytest.mark.parametrize("static", [True, False])
def test_split_input_opset13(static):
    check("Split", {"x": X, "s": ints(1, 3)}, {"axis": 2}, initializers={"s"} if static else None,
          n_outputs=2, opset=13, exact=True)
    check("Split", {"x": X}, {"axis": -3}, n_outputs=3, opset=13, exact=True)


@pytest.mark.parametrize("parts,axis", [(2, 3), (3, 3), (4, 2), (2, -4)])
def test_split_num_outputs_opset18(parts, axis):
    check("Split", {"x": X}, {"axis": axis, "num_outputs": parts}, n_outputs=parts, opset=18, exact=True)


# -------------------------------------------------------------------- Slice --
SLICES = [
    ([0], [2], [1], None),
    ([1, 0], [3, -1], [1, 3], None),
    ([-3], [INT_MAX], [-1], None),
    ([-100], [100], [0], None),
    ([3], [0], [3], [-1]),
    ([INT_MAX], [-INT_MAX], [2], [-1]),
    ([-1], [-100], [-1], [-2]),
    ([10], [-10], [3], [-1]),
    ([1, 4], [3, 0], [-3, 3], [1, -2]),
    ([0, 0, 0, 0], [2, 3, 4, 5], None, [1, 2, 3, 4]),
    ([5], [1], [3], [1]),  # empty
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    inputs = {"x": X, "starts": ints(*starts), "ends": ints(*ends),
              "axes": None if axes is None else ints(*axes), "steps": None if steps is None else ints(*steps)}
    check("Slice", {k: v for k, v in inputs.items() if not (k == "steps" and v is None)},
          initializers={"starts", "ends", "axes", "steps"}, exact=True)


def test_slice_dynamic_int32():
    inputs = {"x": X, "starts": np.array([1], np.int32), "ends": np.array([-1], np.int32),
              "axes": np.array([-2], np.int32), "steps": np.array([2], np.int32)}
    check("Slice", inputs, opset=11, exact=True)


# ------------------------------------------------------------ Expand/Tile --
@pytest.mark.parametrize("shape", [(1, 1, 5), (2, 1, 6), (1,), (4, 2, 3, 1)])
@pytest.mark.parametrize("static", [True, False])
def test_expand(shape, static):
    data = RNG.standard_normal((2, 1, 1)).astype(np.float32)
    check("Expand", {"x": data, "s": ints(*shape)}, initializers={"s"} if static else None, exact=True)


@pytest.mark.parametrize("repeats", [(1, 1, 1, 1), (2, 1, 3, 1), (1, 0, 2, 1)])
@pytest.mark.parametrize("static", [True, False])
def test_tile(repeats, static):
    check("Tile", {"x": X, "r": ints(*repeats)}, initializers={"r"} if static else None, exact=True)


# ---------------------------------------------------------------------- Pad --
PADS = [(0, 0, 1, 2, 0, 0, 2, 1), (0, 1, 0, 0, 0, 0, 0, 3), (0, 0, -1, 1, 0, 0, 1, -2)]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PADS)
def test_pad_modes(mode, pads):
    check("Pad", {"x": X, "p": ints(*pads)}, {"mode": mode}, initializers={"p"}, opset=11, exact=True)


def test_pad_constant_value_and_dynamic():
    check("Pad", {"x": X, "p": ints(*PADS[0]), "v": np.array(2.5, np.float32)}, opset=13, exact=True)
    check("Pad", {"x": X, "p": ints(*PADS[0]), "v": np.array(-1.0, np.float32)}, initializers={"p", "v"},
          opset=11, exact=True)
    check("Pad", {"x": ints(1, 2, 3), "p": ints(2, 1), "v": np.array(7, I64)}, initializers={"p"}, exact=True)


def test_pad_axes_opset18():
    inputs = {"x": X, "p": ints(1, 2, 3, 0), "v": None, "a": ints(-1, 1)}
    check("Pad", inputs, {"mode": "constant"}, initializers={"p", "a"}, opset=18, exact=True)
    inputs = {"x": X, "p": ints(1, -1), "v": np.array(4.0, np.float32), "a": ints(2)}
    check("Pad", inputs, {"mode": "edge"}, initializers={"p", "a"}, opset=18, exact=True)


@pytest.mark.parametrize("pads", [(0, 0, 1, 2, 0, 0, 3, 1), (0, 0, -1, 2, 0, 0, 2, 0)])
def test_pad_wrap_opset19(pads):
    check("Pad", {"x": X, "p": ints(*pads)}, {"mode": "wrap"}, initializers={"p"}, opset=19, exact=True)


def test_pad_wrap_before_opset19_is_unsupported():
    graph = Graph(opset=18)
    x, y = graph.create_variable("x"), graph.create_variable("y")
    graph.create_operation("Pad", [x], [y], {"mode": "wrap"})
    with pytest.raises(UnsupportedOperationError):
        build_kernel(graph.operations["pad"], 18)


# ----------------------------------------------------- Shape, Size, Identity --
def test_shape_and_size():
    check("Shape", {"x": X}, opset=13)
    check("Size", {"x": X})
    check("Size", {"x": np.array(1.0, np.float32)})


@pytest.mark.parametrize("start,end", [(1, None), (-2, None), (0, -1), (-10, 10), (3, 1)])
def test_shape_start_end_opset15(start, end):
    attributes = {"start": start} if end is None else {"start": start, "end": end}
    check("Shape", {"x": X}, attributes, opset=15)


def test_identity_and_dropout():
    assert check("Identity", {"x": X}, exact=True)[0] is not None
    check("Dropout", {"x": X}, opset=11, exact=True)
    check("Dropout", {"x": X}, n_outputs=2, opset=11, exact=True)
    check("Dropout", {"x": X, "r": np.array(0.3, np.float32)}, n_outputs=2, initializers={"r"}, opset=13)
    check("Dropout", {"x": X, "r": np.array(0.3, np.float32), "t": np.array(False)}, n_outputs=2, opset=13)


# ------------------------------------------------------- Depth <-> Space --
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    data = RNG.standard_normal((2, 8, 3, 4)).astype(np.float32)
    check("DepthToSpace", {"x": data}, {"blocksize": 2, "mode": mode}, exact=True)


def test_space_to_depth():
    data = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    check("SpaceToDepth", {"x": data}, {"blocksize": 2}, exact=True)


def test_layout_ops_do_not_copy():
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

    def run(op_type, inputs, attributes=None, opset=13):
        op = Operation("n", op_type, attributes)
        op.outputs = [None]
        return tensor.KERNELS[op_type](op, opset)([data, *inputs])[0]

    for out in (run("Reshape", [ints(4, 6)]), run("Transpose", []), run("Flatten", []),
                run("Squeeze", [None]), run("Unsqueeze", [ints(0)]),
                run("Slice", [ints(1), ints(3), ints(2)]), run("Expand", [ints(2, 2, 3, 4)])):
        assert np.shares_memory(out, data)
    assert data.flags.writeable and (data == np.arange(24).reshape(2, 3, 4)).all()
