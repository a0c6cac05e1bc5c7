"""The peer quantizers of the benchmark: NNCF, NVIDIA ModelOpt (ONNX PTQ) and AMD Quark (ONNX PTQ).

They are benchmark-only dependencies that live in a venv of their own (``bench/peers_venv.sh``; their onnx pins
differ from ppqlike's): ``bench/run.py`` runs each peer row as a child process of that venv's Python, which
decodes the same calibration images as every other row (``presets.LazyImageBatches``), quantizes with the tool's
documented defaults and writes a QDQ ONNX model; the parent then evaluates that model in onnxruntime like the
other rows.  Where the venv is absent, or a tool does not import in it, the rows say so (``unavailable``).

Configuration keys (``<tool>:<variant>``):

* ``nncf:default`` — ``nncf.quantize(model, nncf.Dataset(...))``: preset PERFORMANCE (symmetric weights and
  activations), fast bias correction on, ``subset_size`` 300 (so every calibration image);
* ``nncf:mixed`` — the same with ``preset=nncf.QuantizationPreset.MIXED`` (asymmetric activations);
* ``modelopt:entropy`` / ``modelopt:max`` — ``modelopt.onnx.quantization.quantize(..., quantize_mode='int8',
  calibration_data=<the images>, calibration_method=..., calibration_eps=['cpu'], high_precision_dtype='fp32')``,
  its other defaults (its default ``high_precision_dtype='fp16'`` converts the unquantized parts to fp16 for
  TensorRT, which onnxruntime's CPU provider computes wrong: see ``MODELOPT_HIGH_PRECISION``);
* ``quark:u8s8_pc`` / ``quark:a8w8_pc`` — Quark's ``ModelQuantizer`` with a ``QConfig`` whose global layer
  config is ``UInt8Spec()`` activations (asymmetric) / ``Int8Spec()`` activations (symmetric, its ``A8W8_QCONFIG``
  options) and ``Int8Spec`` weights per channel; every spec keeps its defaults (Percentile calibration).

This module imports nothing but the standard library at the top: the parent (ppqlike's venv) reads the key
table and probes the venv; the peer functions import their tool inside the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
#: where bench/peers_venv.sh puts the venv by default; PPQLIKE_PEERS_PYTHON names another interpreter
DEFAULT_VENV = REPO.parent / "peers-venv"
PEER_TOOLS = ("nncf", "modelopt", "quark")
#: the module each tool's rows import (probed once per run)
_IMPORTS = {"nncf": "nncf", "modelopt": "modelopt.onnx.quantization", "quark": "quark.onnx"}
_DISTRIBUTIONS = {"nncf": "nncf", "modelopt": "nvidia-modelopt", "quark": "amd-quark"}
#: NNCF: one image per dataset item, as its examples do (its statistics count items, not images)
NNCF_ITEM_BATCH = 1
#: ModelOpt converts what it leaves unquantized to fp16 by default (for TensorRT); onnxruntime's CPU provider
#: computes such graphs wrong (MobileNetV2 int8 'max': top-1 agreement 0.03 with graph optimizations on
#: onnxruntime 1.32, 0.97 without; 0.03 on 1.24 either way), so the rows keep the float parts in fp32, the
#: documented alternative: what is measured is the int8 quantization
MODELOPT_HIGH_PRECISION = "fp32"
#: Quark reads calibration batches through an onnxruntime CalibrationDataReader
READER_BATCH = 1


@dataclass(frozen=True)
class PeerVariant:
    """One peer row: its tool, variant name, label and the class of its activation quantization."""

    tool: str
    variant: str
    label: str
    activation_class: str   # 'asymmetric' (unsigned/asymmetric activations) or 'symmetric' (signed symmetric)
    per_channel: bool

    @property
    def key(self) -> str:
        return f"{self.tool}:{self.variant}"


PEER_VARIANTS = (
    PeerVariant("nncf", "default", "NNCF default (PERFORMANCE: symmetric)", "symmetric", True),
    PeerVariant("nncf", "mixed", "NNCF MIXED (asymmetric activations)", "asymmetric", True),
    PeerVariant("modelopt", "entropy", "ModelOpt int8 entropy", "symmetric", True),
    PeerVariant("modelopt", "max", "ModelOpt int8 max", "symmetric", True),
    PeerVariant("quark", "u8s8_pc", "Quark U8S8 per-channel", "asymmetric", True),
    PeerVariant("quark", "a8w8_pc", "Quark A8W8 per-channel", "symmetric", True),
)
VARIANTS_BY_KEY = {v.key: v for v in PEER_VARIANTS}


# ---------------------------------------------------------------- the parent side: where the venv is, what imports

def peer_python() -> Path:
    """The peers' interpreter: $PPQLIKE_PEERS_PYTHON, else ``../peers-venv/bin/python`` beside the repository."""
    named = os.environ.get("PPQLIKE_PEERS_PYTHON")
    return Path(named) if named else DEFAULT_VENV / "bin" / "python"


@lru_cache(maxsize=None)
def unavailable(tool: str) -> str | None:
    """Why ``tool``'s rows cannot run here (None: they can): no venv, or the tool does not import in it."""
    python = peer_python()
    if not python.exists():
        return (f"no peers venv ({python} is missing; make it with `bash bench/peers_venv.sh`, or name its "
                "interpreter in PPQLIKE_PEERS_PYTHON)")
    probe = (f"import importlib.metadata as m, {_IMPORTS[tool]}; "
             f"print(m.version({_DISTRIBUTIONS[tool]!r}))")
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{python} could not run: {error}"
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return f"`import {_IMPORTS[tool]}` fails in {python}: {tail}"
    return None


def versions_note(tools) -> str:
    """One line for the report: which peer versions quantized (or why a tool's rows are unavailable)."""
    python = peer_python()
    parts = []
    for tool in tools:
        reason = unavailable(tool)
        parts.append(f"{tool}: unavailable ({reason})" if reason else _versions(python, tool))
    return (f"Peers (bench/peers.py), quantizing in their own venv ({python}): " + "; ".join(parts)
            + ". Their models are evaluated like every other row, in this run's onnxruntime.")


def _versions(python: Path, tool: str) -> str:
    names = (_DISTRIBUTIONS[tool], "onnx", "onnxruntime") + (("torch",) if tool == "modelopt" else ())
    code = f"import importlib.metadata as m; print(', '.join(n + ' ' + m.version(n) for n in {names!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"{tool} (versions unknown)"


# ---------------------------------------------------------------- the child side (inside the peers venv)

def _image_batches(spec: dict, batch: int):
    import presets
    from matrix import _TimedBatches
    files = presets.image_files("calib", spec["calib_images"])
    return _TimedBatches(presets.LazyImageBatches(spec["model"], files, batch))


def _reader(batches, input_name: str):
    """An onnxruntime CalibrationDataReader over ``batches`` (decoded lazily, rewindable)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.iterator = iter(batches)

        def get_next(self):
            batch = next(self.iterator, None)
            return None if batch is None else {input_name: batch}

        def rewind(self):
            self.iterator = iter(batches)

        def reset(self):
            self.rewind()

    return Reader()


def _quantize_nncf(spec: dict, preset) -> dict:
    import nncf
    import onnx
    model = onnx.load(str(preset.path))
    batches = _image_batches(spec, NNCF_ITEM_BATCH)
    dataset = nncf.Dataset(batches, lambda images: {preset.input_name: images})
    options = {} if spec["variant"] == "default" else {"preset": nncf.QuantizationPreset.MIXED}
    started = time.perf_counter()
    quantized = nncf.quantize(model, dataset, **options)
    done = time.perf_counter()
    onnx.save(quantized, spec["output"])
    return {"quantize_seconds": done - started, "save_seconds": time.perf_counter() - done,
            "decode_seconds": batches.seconds, "calibration_images": batches.images,
            "call": "nncf.quantize(model, nncf.Dataset(...)" + (", preset=MIXED" if options else "") + ")"}


def _private_copy(preset, spec: dict) -> str:
    """A copy of the model in the output folder: ModelOpt and Quark write next to the model they are given
    (shape-inferred and intermediate models; the shared models were rewritten in place by one of them once),
    and the shared folder must never change."""
    import shutil
    copy = Path(spec["output"]).parent / f"{Path(spec['output']).stem}.input.onnx"
    shutil.copyfile(preset.path, copy)
    return str(copy)


def _quantize_modelopt(spec: dict, preset) -> dict:
    import numpy as np
    from modelopt.onnx.quantization import quantize
    batches = _image_batches(spec, spec["batch"])
    images = np.concatenate(list(batches))   # its documented input: every calibration sample in one array
    started = time.perf_counter()
    quantize(_private_copy(preset, spec), quantize_mode="int8", calibration_data=images,
             calibration_method=spec["variant"],
             calibration_eps=["cpu"], high_precision_dtype=MODELOPT_HIGH_PRECISION, output_path=spec["output"],
             log_level="WARNING")
    return {"quantize_seconds": time.perf_counter() - started, "decode_seconds": batches.seconds,
            "calibration_images": batches.images,
            "call": f"modelopt.onnx.quantization.quantize(quantize_mode='int8', calibration_data=<images>, "
                    f"calibration_method='{spec['variant']}', calibration_eps=['cpu'], "
                    f"high_precision_dtype='{MODELOPT_HIGH_PRECISION}')"}


def _quark_config(variant: str):
    from quark.onnx import A8W8_QCONFIG, QConfig
    from quark.onnx.quantization.config.spec import Int8Spec, QLayerConfig, QuantGranularity, UInt8Spec
    weights = Int8Spec(quant_granularity=QuantGranularity.Channel)
    if variant == "u8s8_pc":
        # U8S8: asymmetric uint8 activations, symmetric int8 weights (the legacy U8S8_AAWS preset's types, with
        # its ForceQuantizeNoInputCheck); every spec's other fields at their defaults
        return QConfig(global_config=QLayerConfig(activation=UInt8Spec(), weight=weights),
                       ForceQuantizeNoInputCheck=True)
    if variant == "a8w8_pc":
        # A8W8_QCONFIG (symmetric int8 activations and weights, its extra options) with per-channel weights
        return QConfig(global_config=QLayerConfig(activation=Int8Spec(), weight=weights),
                       **dict(A8W8_QCONFIG.extra_options))
    raise ValueError(f"unknown Quark variant {variant!r}")


def _quantize_quark(spec: dict, preset) -> dict:
    from quark.onnx import ModelQuantizer
    config = _quark_config(spec["variant"])
    batches = _image_batches(spec, READER_BATCH)
    started = time.perf_counter()
    ModelQuantizer(config).quantize_model(_private_copy(preset, spec), spec["output"],
                                          _reader(batches, preset.input_name))
    return {"quantize_seconds": time.perf_counter() - started, "decode_seconds": batches.seconds,
            "calibration_images": batches.images,
            "call": f"quark.onnx.ModelQuantizer(QConfig({spec['variant']})).quantize_model(...)"}


def quantize_child(spec: dict) -> dict:
    """Entry point of a peer child (``spec['kind']`` is the tool): quantize, then describe the written model."""
    import importlib.metadata

    import presets
    preset = presets.PRESETS[spec["model"]]
    os.chdir(Path(spec["output"]).parent)   # Quark writes quantized_info.csv (and others their logs) here
    result = {"nncf": _quantize_nncf, "modelopt": _quantize_modelopt, "quark": _quantize_quark}[spec["kind"]](
        spec, preset)
    variant = VARIANTS_BY_KEY[f"{spec['kind']}:{spec['variant']}"]
    result.update(qdq_summary(spec["output"]), per_channel=variant.per_channel,
                  versions={n: importlib.metadata.version(n)
                            for n in (_DISTRIBUTIONS[spec["kind"]], "onnx", "onnxruntime")})
    return result


# ---------------------------------------------------------------- what a QDQ model holds

def qdq_summary(path) -> dict:
    """What the quantized model at ``path`` quantizes and how: counts of activation QuantizeLinear nodes by
    (type, zero point, per-channel or not), weight DequantizeLinear nodes by (type, per-channel or not), how many
    Conv/MatMul/Gemm there are and which of them read an input or a weight that is not dequantized (through
    Identity/Reshape/Pad/MaxPool/Dropout/Concat: left in float), whether the model's outputs (the input of a
    final Softmax: the logits) come out of a DequantizeLinear, and whether it carries float16."""
    import collections

    import numpy as np
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path))
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    constants[node.output[0]] = attribute.t
    producer = {o: n for n in graph.node for o in n.output}
    activations: collections.Counter = collections.Counter()
    weights: collections.Counter = collections.Counter()
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        zero = numpy_helper.to_array(constants[node.input[2]]) if len(node.input) > 2 and node.input[2] in \
            constants else None
        if zero is not None:
            kind = str(zero.dtype)
        elif node.op_type == "QuantizeLinear":
            kind = "uint8"        # the operator's default output type
        else:
            kind = str(numpy_helper.to_array(constants[node.input[0]]).dtype) if node.input[0] in constants else "?"
        on_constant = node.input[0] in constants
        if node.op_type == "QuantizeLinear" and not on_constant:
            values = np.zeros(1) if zero is None else zero
            form = "zero 0" if np.all(values == 0) else "zero 128" if np.all(values == 128) else "asymmetric"
            scale = constants.get(node.input[1])
            per_channel = scale is not None and numpy_helper.to_array(scale).size > 1   # NNCF: depthwise inputs
            activations[f"{kind} {form}" + (" per-channel" if per_channel else "")] += 1
        elif on_constant:   # a weight: DequantizeLinear of an integer constant, or Q then DQ of a float one
            scale = constants.get(node.input[1])
            per_channel = scale is not None and numpy_helper.to_array(scale).size > 1
            weights[f"{kind} {'per-channel' if per_channel else 'per-tensor'}"] += 1
    compute = [n for n in graph.node if n.op_type in ("Conv", "MatMul", "Gemm", "ConvTranspose")]

    def dequantized(name: str, depth: int = 0) -> bool:
        """Whether ``name`` comes from a DequantizeLinear, through ops that only move, copy, pad or take the
        maximum of values (Concat: every input)."""
        node = producer.get(name)
        if node is None or depth > 8:
            return False
        if node.op_type == "DequantizeLinear":
            return True
        if node.op_type == "Concat":
            return all(dequantized(i, depth + 1) for i in node.input)
        return node.op_type in _PASS_THROUGH and dequantized(node.input[0], depth + 1)

    def logits(name: str) -> str:
        """The tensor a final (float) Softmax reads, else ``name``: the logits."""
        node = producer.get(name)
        return node.input[0] if node is not None and node.op_type == "Softmax" else name

    float_compute = [n.name or n.output[0] for n in compute if not all(dequantized(i) for i in n.input[:2])]
    float16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer) or any(
        a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for n in graph.node if n.op_type == "Cast"
        for a in n.attribute)
    return {"activation_quantizers": dict(activations), "weight_quantizers": dict(weights),
            "compute_ops": len(compute), "float_compute_ops": float_compute,
            "output_quantized": all(dequantized(logits(o.name)) for o in graph.output), "float16": float16,
            "activation": _activation_text(activations)}


#: ops that only move, copy, pad with zeros or take the maximum of values (Dropout: at inference): a Q/DQ pair before them quantizes
#: what they pass on (NNCF and ModelOpt put it there)
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Pad",
                           "MaxPool", "Dropout"})


def _activation_text(counts) -> str:
    """The activation quantizers in words: 'symmetric int8', 'asymmetric uint8', 'uint8 [0, max] (zero point 0)'
    (zero point 0: the range [0, max]), ... joined with their counts where the model mixes kinds."""
    words = {"int8 zero 0": "symmetric int8", "uint8 zero 128": "symmetric uint8",
             "uint8 zero 0": "uint8 [0, max] (zero point 0)", "uint8 asymmetric": "asymmetric uint8",
             "int8 asymmetric": "asymmetric int8"}
    def word(key: str) -> str:
        channel = key.endswith(" per-channel")
        base = key[:-len(" per-channel")] if channel else key
        return words.get(base, base) + (" per-channel" if channel else "")

    if not counts:
        return "none"
    if len(counts) == 1:
        return word(next(iter(counts)))
    return "mixed: " + ", ".join(f"{n} {word(k)}" for k, n in sorted(counts.items(), key=lambda i: -i[1]))


if __name__ == "__main__":  # python bench/peers.py MODEL.onnx: what a QDQ model quantizes
    import sys
    print(json.dumps(qdq_summary(sys.argv[1]), indent=1))
