"""The dev set's family metrics (bench/family_metrics.py) and the harness's handling of absent families."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import families  # noqa: E402
import family_metrics as fm  # noqa: E402


def test_cosine_per_sample_exact_and_non_finite():
    reference = np.array([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0], [0.0, 0.0]])
    output = np.array([[0.0, 2.0], [2.0, 2.0], [np.inf, 4.0], [0.0, 0.0]])
    cosine = fm.cosine_per_sample(output, reference)
    assert cosine[0] == 0.0 and cosine[1] == pytest.approx(1.0) and np.isnan(cosine[2]) and cosine[3] == 1.0


def test_box_iou_and_class_wise_nms():
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10], [20, 20, 30, 30]], np.float64)
    assert fm.box_iou(boxes[:1], boxes[1:2])[0, 0] == pytest.approx(90 / 110)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    classes = np.array([0, 0, 1, 0])
    # box 1 overlaps box 0 (same class) at 0.82 > 0.7: suppressed; box 2 is another class: kept
    assert fm.nms(boxes, scores, classes, iou=0.7).tolist() == [0, 2, 3]
    assert fm.nms(boxes, scores, classes, iou=0.9).tolist() == [0, 1, 2, 3]


def test_detection_f1_counts_class_and_iou():
    reference = [(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([1, 2]))]
    found = [(np.array([[0, 0, 10, 9], [20, 20, 30, 30], [50, 50, 60, 60]], float), np.array([1, 3, 2]))]
    result = fm.detection_f1(found, reference, iou=0.5)
    # one match (the class-3 box has the wrong class), 3 found, 2 reference: F1 = 2 / 5
    assert result["matched"] == 1 and result["f1"] == pytest.approx(0.4)
    assert fm.detection_f1([(np.zeros((0, 4)), np.zeros(0))], [(np.zeros((0, 4)), np.zeros(0))], 0.5)["f1"] == 1.0


def test_yolo_boxes_decode_xywh():
    output = np.zeros((1, 4 + 2, 3))
    output[0, :4, 0] = [50, 40, 20, 10]          # centre 50,40, 20 wide, 10 high
    output[0, 4:, 0] = [0.1, 0.9]
    output[0, 4:, 1] = [0.2, 0.3]                 # under the threshold
    boxes, classes = fm.yolo_boxes(output, score_threshold=0.5, iou=0.7)[0]
    assert boxes.tolist() == [[40, 35, 60, 45]] and classes.tolist() == [1]


def test_picodet_boxes_decode_dfl_distances():
    bins = 8
    logits = np.full((1, 4, 4 * bins), -50.0)      # input 16x16, stride 8: a 2x2 grid
    for side, distance in enumerate((1, 2, 3, 4)):
        logits[0, 3, side * bins + distance] = 50.0   # anchor 3: centre (12, 12)
    scores = np.zeros((1, 4, 3))
    scores[0, 3, 2] = 0.8
    boxes, classes = fm.picodet_boxes([scores], [logits], (8,), (16, 16), 0.5, 0.5)[0]
    assert classes.tolist() == [2]
    assert boxes[0] == pytest.approx([12 - 8, 12 - 16, 12 + 24, 12 + 32])


def test_ctc_greedy_and_edit_distance():
    steps = np.eye(4)[[0, 1, 1, 0, 1, 2, 2, 3, 0]][None]
    assert fm.ctc_greedy(steps) == [(1, 1, 2, 3)]
    assert fm.edit_distance((1, 2, 3), (1, 3)) == 1 and fm.edit_distance("kitten", "sitting") == 3


def test_map_f1_and_neighbours():
    reference = {"m": np.array([[0.9, 0.1, 0.8, 0.2]])}
    quantized = {"m": np.array([[0.9, 0.6, 0.2, 0.2]])}
    assert fm.family_metric(reference, quantized, {"kind": "map_f1", "output": "m", "threshold": 0.5})["f1"] == 0.5
    points = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    moved = points.copy()
    moved[1] = [0.0, 1.0]                          # sample 1 is now nearest to 2, sample 2 nearest to 1
    result = fm.family_metric({"e": points}, {"e": moved}, {"kind": "neighbours", "output": "e"})
    assert result["neighbour_agreement"] < 1.0
    assert fm.family_metric({"e": points}, {"e": points}, {"kind": "neighbours", "output": "e"})["score"] == 1.0


def test_harness_skips_absent_family(tmp_path, capsys):
    (tmp_path / "half_built").mkdir()
    (tmp_path / "half_built" / "model.onnx").write_bytes(b"")
    families.main(["--devset", str(tmp_path), "--no-ort", "--json", str(tmp_path / "out.json")])
    printed = capsys.readouterr().out
    assert "Skipped: half_built: model.onnx, calib.npz, dev.npz or manifest.json absent" in printed
    assert '"results": []' in (tmp_path / "out.json").read_text()
