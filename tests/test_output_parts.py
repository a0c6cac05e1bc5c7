"""The output measure of the accuracy passes on an output a Concat wrote (a detector's boxes and scores)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from ppqlike.optim.passes.sensitivity import output_parts, sample_cosines

from onnx_helpers import make_model


def _detector_head(tmp_path, last="Concat", shapes=True):
    """boxes [N, 4, 6] scaled to pixels and class logits [N, 2, 6] through a Sigmoid, joined on axis 1."""
    def info(name, channels):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", channels, 6] if shapes else None)
    nodes = [helper.make_node("Mul", ["boxes", "pixels"], ["scaled"]),
             helper.make_node("Sigmoid", ["logits"], ["scores"])]
    if last == "Concat":
        nodes.append(helper.make_node("Concat", ["scaled", "scores"], ["y"], axis=1))
    else:
        nodes.append(helper.make_node("Sigmoid", ["scaled"], ["y"]))
    model = make_model(nodes, [info("boxes", 4), info("logits", 2)], [info("y", 6 if last == "Concat" else 4)],
                       [numpy_helper.from_array(np.array(320.0, np.float32), "pixels")],
                       value_info=[info("scaled", 4), info("scores", 2)] if shapes else ())
    path = tmp_path / "head.onnx"
    onnx.save(model, str(path))
    return ppqlike.load_onnx_graph(str(path))


def test_output_parts_are_the_concat_inputs_sizes_along_its_axis(tmp_path):
    assert output_parts(_detector_head(tmp_path)) == [(1, [4, 2])]
    assert output_parts(_detector_head(tmp_path, last="Sigmoid")) == [None]


def test_sample_cosines_compare_each_part_over_the_batch():
    """One of two detections' score 0.9 -> 0.3 is invisible beside boxes in pixels compared as one vector, and
    in each sample's scores alone (a cosine does not see one value scaled); as parts compared over the batch,
    each sample gets the mean of the parts' cosines."""
    rng = np.random.default_rng(0)
    boxes = rng.uniform(10, 300, (2, 4, 6))
    scores = rng.uniform(0.0, 0.01, (2, 2, 6))
    scores[0, 1, 3] = scores[1, 0, 2] = 0.9         # a detection in each sample
    want = np.concatenate([boxes, scores], axis=1)
    got = want.copy()
    got[0, 5, 3] = 0.3
    whole = sample_cosines([got], [want])
    assert whole.min() > 0.99999
    parted = sample_cosines([got], [want], [(1, [4, 2])])
    g, w = got[:, 4:].reshape(-1), want[:, 4:].reshape(-1)
    expected = (1.0 + g @ w / np.linalg.norm(g) / np.linalg.norm(w)) / 2
    np.testing.assert_allclose(parted, [expected, expected], rtol=1e-12)
    assert expected < 0.95
    per_sample = [sample_cosines([got[i:i + 1, 4:]], [want[i:i + 1, 4:]])[0] for i in range(2)]
    assert min(per_sample) > 0.999
    # parts that do not fit the array (another batch layout) leave it whole
    np.testing.assert_array_equal(sample_cosines([got], [want], [(1, [4, 3])]), whole)
