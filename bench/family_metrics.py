"""Family metrics of the dev set (numpy only): how far a quantized model's outputs are from the FP32 model's.

Each metric takes the FP32 outputs and the quantized outputs (dicts output name -> [samples, ...], as run on
the dev inputs) and the metric's parameters from the family's ``manifest.json``, and returns a dict whose
``score`` is in [0, 1] (1: the quantized model decides as the FP32 model does).

* ``yolo`` — Ultralytics-style [N, 4 + classes, anchors] (xywh pixels, class probabilities): boxes over the
  score threshold, class-wise NMS, then detection F1 of the quantized boxes against the FP32 boxes;
* ``picodet`` — PicoDet heads (per stride: class probabilities [1, anchors, classes] and DFL logits
  [1, anchors, 4 * bins]): decoded, NMS, F1 against FP32 as for ``yolo``;
* ``top1`` — top-1 agreement;
* ``map_f1`` — F1 of the cells over a threshold (text maps, note activations, speech frames);
* ``ctc`` — greedy CTC decoding: fraction of identical sequences, and the edit distance per FP32 symbol;
* ``neighbours`` — sentence embeddings: fraction of samples whose nearest other sample is the FP32 one's.
"""

from __future__ import annotations

import numpy as np


def cosine_per_sample(output: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine between each sample's flattened output and reference (float64); NaN where either is not finite,
    1 where both are zero."""
    a = np.asarray(output, np.float64).reshape(len(output), -1)
    b = np.asarray(reference, np.float64).reshape(len(reference), -1)
    finite = np.isfinite(a).all(1) & np.isfinite(b).all(1)
    a, b = np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(b), b, 0.0)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cosine = np.where(both_zero, 1.0, np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1.0))
    return np.where(finite, cosine, np.nan)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(a), len(b)] IoU of corner-form boxes (x1, y1, x2, y2)."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float, limit: int = 300) -> np.ndarray:
    """Indices kept by class-wise greedy non-maximum suppression, best score first, at most ``limit``."""
    keep = []
    for cls in np.unique(classes):
        index = np.flatnonzero(classes == cls)
        index = index[np.argsort(-scores[index], kind="stable")]
        while len(index):
            keep.append(index[0])
            if len(index) == 1:
                break
            overlap = box_iou(boxes[index[:1]], boxes[index[1:]])[0]
            index = index[1:][overlap <= iou]
    keep = np.array(keep, np.int64)
    return keep[np.argsort(-scores[keep], kind="stable")][:limit]


def match_detections(found, reference, iou: float) -> int:
    """True positives: ``found`` (boxes, classes) greedily matched, best IoU first, to ``reference`` boxes of
    the same class at IoU >= ``iou``, each reference box at most once."""
    boxes, classes = found
    ref_boxes, ref_classes = reference
    if not len(boxes) or not len(ref_boxes):
        return 0
    overlap = box_iou(boxes, ref_boxes) * (classes[:, None] == ref_classes[None, :])
    pairs = np.argwhere(overlap >= iou)
    pairs = pairs[np.argsort(-overlap[pairs[:, 0], pairs[:, 1]], kind="stable")]
    used_found, used_ref = set(), set()
    for i, j in pairs:
        if i not in used_found and j not in used_ref:
            used_found.add(i)
            used_ref.add(j)
    return len(used_found)


def detection_f1(found: list, reference: list, iou: float) -> dict:
    """F1 over every sample of ``found`` against ``reference`` (lists of (boxes, classes) per sample)."""
    tp = sum(match_detections(f, r, iou) for f, r in zip(found, reference))
    n_found, n_ref = sum(len(f[0]) for f in found), sum(len(r[0]) for r in reference)
    f1 = 1.0 if n_found + n_ref == 0 else 2.0 * tp / (n_found + n_ref)
    return {"score": f1, "f1": f1, "boxes": n_found, "reference_boxes": n_ref, "matched": tp}


def yolo_boxes(output: np.ndarray, score_threshold: float, iou: float) -> list:
    """Per sample (boxes xyxy, classes) of an [N, 4 + classes, anchors] Ultralytics output after NMS."""
    result = []
    for sample in np.asarray(output, np.float64):
        scores = sample[4:]
        classes, best = scores.argmax(0), scores.max(0)
        keep = np.flatnonzero(best > score_threshold)
        xywh = sample[:4, keep].T
        boxes = np.concatenate((xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2), 1)
        kept = nms(boxes, best[keep], classes[keep], iou)
        result.append((boxes[kept], classes[keep][kept]))
    return result


def picodet_boxes(scores: list, distributions: list, strides, input_hw, score_threshold: float, iou: float) -> list:
    """Per sample (boxes xyxy, classes) of PicoDet heads: ``scores[level]`` [N, anchors, classes] probabilities
    and ``distributions[level]`` [N, anchors, 4 * bins] DFL logits, level ``l`` of stride ``strides[l]``."""
    result = []
    for n in range(len(scores[0])):
        boxes, best, classes = [], [], []
        for score, dist, stride in zip(scores, distributions, strides):
            height, width = int(np.ceil(input_hw[0] / stride)), int(np.ceil(input_hw[1] / stride))
            rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
            centre = np.stack(((cols.ravel() + 0.5) * stride, (rows.ravel() + 0.5) * stride), 1)
            logits = np.asarray(dist[n], np.float64)
            bins = logits.reshape(len(logits), 4, -1)
            weights = np.exp(bins - bins.max(2, keepdims=True))
            distance = (weights / weights.sum(2, keepdims=True) * np.arange(bins.shape[2])).sum(2) * stride
            boxes.append(np.concatenate((centre - distance[:, :2], centre + distance[:, 2:]), 1))
            best.append(np.max(score[n], 1))
            classes.append(np.argmax(score[n], 1))
        boxes, best, classes = np.concatenate(boxes), np.concatenate(best), np.concatenate(classes)
        keep = np.flatnonzero(best > score_threshold)
        kept = nms(boxes[keep], best[keep], classes[keep], iou)
        result.append((boxes[keep][kept], classes[keep][kept]))
    return result


def ctc_greedy(probabilities: np.ndarray, blank: int = 0) -> list:
    """Per sample the label sequence of greedy CTC decoding: best class per step, repeats merged, blanks dropped."""
    sequences = []
    for best in np.asarray(probabilities).argmax(-1):
        merged = best[np.concatenate(([True], best[1:] != best[:-1]))]
        sequences.append(tuple(int(v) for v in merged[merged != blank]))
    return sequences


def edit_distance(a, b) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _metric_yolo(fp32, quantized, params):
    decode = lambda outputs: yolo_boxes(outputs[params["output"]], params["score_threshold"], params["nms_iou"])
    return detection_f1(decode(quantized), decode(fp32), params["match_iou"])


def _metric_picodet(fp32, quantized, params):
    def decode(outputs):
        return picodet_boxes([outputs[k] for k in params["score_outputs"]],
                             [outputs[k] for k in params["box_outputs"]], params["strides"], params["input_hw"],
                             params["score_threshold"], params["nms_iou"])
    return detection_f1(decode(quantized), decode(fp32), params["match_iou"])


def _metric_top1(fp32, quantized, params):
    a = np.asarray(quantized[params["output"]]).reshape(len(quantized[params["output"]]), -1)
    b = np.asarray(fp32[params["output"]]).reshape(len(a), -1)
    agreement = float(np.mean(a.argmax(1) == b.argmax(1)))
    return {"score": agreement, "top1_agreement": agreement}


def _metric_map_f1(fp32, quantized, params):
    found = np.asarray(quantized[params["output"]]) > params["threshold"]
    reference = np.asarray(fp32[params["output"]]) > params["threshold"]
    tp, total = int(np.sum(found & reference)), int(found.sum() + reference.sum())
    f1 = 1.0 if total == 0 else 2.0 * tp / total
    return {"score": f1, "f1": f1, "positive_fraction_fp32": float(reference.mean()),
            "positive_fraction": float(found.mean())}


def _metric_ctc(fp32, quantized, params):
    found = ctc_greedy(quantized[params["output"]], params.get("blank", 0))
    reference = ctc_greedy(fp32[params["output"]], params.get("blank", 0))
    same = float(np.mean([f == r for f, r in zip(found, reference)]))
    errors = sum(edit_distance(f, r) for f, r in zip(found, reference))
    symbols = max(1, sum(len(r) for r in reference))
    return {"score": same, "sequence_agreement": same, "symbol_error_rate": errors / symbols}


def nearest_neighbours(embeddings: np.ndarray) -> np.ndarray:
    """Per sample the index of the most cosine-similar other sample."""
    x = np.asarray(embeddings, np.float64)
    x = x.reshape(len(x), -1)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    similarity = x @ x.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(1)


def _metric_neighbours(fp32, quantized, params):
    found, reference = quantized[params["output"]], fp32[params["output"]]
    agreement = float(np.mean(nearest_neighbours(found) == nearest_neighbours(reference)))
    return {"score": agreement, "neighbour_agreement": agreement}


METRICS = {"yolo": _metric_yolo, "picodet": _metric_picodet, "top1": _metric_top1, "map_f1": _metric_map_f1,
           "ctc": _metric_ctc, "neighbours": _metric_neighbours}


def family_metric(fp32: dict, quantized: dict, params: dict) -> dict:
    """The family metric named ``params['kind']`` of ``quantized`` against ``fp32`` (output name -> array);
    non-finite quantized values count as they compare (NaN is never over a threshold)."""
    if params["kind"] not in METRICS:
        raise ValueError(f"unknown family metric {params['kind']!r}; known: {', '.join(METRICS)}")
    return {"kind": params["kind"], **METRICS[params["kind"]](fp32, quantized, params)}
