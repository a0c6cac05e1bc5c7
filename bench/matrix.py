"""The configurations of the benchmark matrix and the child processes that quantize and simulate.

Every quantization runs in a child process of its own (``python bench/run.py --child SPEC``) so
that the operating system measures its wall time and peak RSS (``os.wait4``); the child decodes
its calibration images itself, lazily, ``batch`` images at a time, and writes the quantized
model.  Simulation (ppqlike's executor on the dev images) runs in another child afterwards, so
that it is not part of the quantization's cost.

Configuration keys:

* ``ppqlike:<PLATFORM>:<observer>[+<pass>...]`` — ppqlike with the platform's preset
  (``QuantizationSettingFactory.for_platform``); observer ``default`` keeps the preset's activation
  observer, any other name sets ``setting.activation_observer`` (``search``: the TPU-MLIR-style
  threshold search); each ``+<pass>`` turns on one accuracy pass of ``ACCURACY_PASSES``;
* ``ort:<MinMax|Entropy|Percentile>:<per_tensor|per_channel>`` — onnxruntime's
  ``quantize_static`` (QDQ format, its default types: QInt8 activations and QInt8 weights)
  after ``quant_pre_process``;
* ``nncf:<default|mixed>``, ``modelopt:<entropy|max>``, ``quark:<u8s8_pc|a8w8_pc>`` — the peer quantizers
  (``bench/peers.py``), run by the Python of their own venv (``bench/peers_venv.sh``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import peers

PPQ_PLATFORMS = ("TRT_INT8", "ORT_INT8", "TPU_INT8", "DSP_INT8")
PPQ_OBSERVERS = ("default", "kl")
# rows for the accuracy passes (issue 6): (platform, observer, passes)
PPQ_ACCURACY_ROWS = (
    ("DSP_INT8", "default", ("equalization",)),
    ("DSP_INT8", "default", ("equalization", "bias_correction")),
    ("ACADEMIC_W4A8", "default", ()),
    ("ACADEMIC_W4A8", "default", ("adaround",)),
    ("ACADEMIC_W4A8", "recipe:best", ()),             # issue 13: W4A8 within 2 points of FP32 top-1
    ("TPU_INT8", "search", ()),
    ("TPU_INT8", "default", ("mixed_precision",)),
    ("ORT_INT8", "default", ("mixed_precision",)),   # the accuracy target moves layers to int16 here
    ("TRT_INT8", "default", ("mixed_precision",)),
    # recipes (issue 13): 'recipe:<name>' sets setting.recipe on the platform's preset ('default' rows run the
    # default recipe, balanced)
    ("ORT_INT8", "recipe:plain", ()),
    ("TRT_INT8", "recipe:plain", ()),
    ("TPU_INT8", "recipe:plain", ()),
    ("ORT_INT8", "recipe:best", ()),
    ("TRT_INT8", "recipe:best", ()),
    ("TPU_INT8", "recipe:best", ()),
)
MIXED_PRECISION_COSINE = 0.99
# the rows a plain ``python bench/run.py`` runs (issue 13's matrix, under 30 minutes on a 2-core machine): each
# recipe of ORT_INT8, TRT_INT8 and TPU_INT8, the accuracy target on ORT_INT8 (16-bit moves) and TRT_INT8 (FP32
# moves), onnxruntime's quantize_static MinMax and Percentile per-channel and MinMax per-tensor (its Entropy
# per-channel row gave MinMax's numbers on all three models in three runs, for 40-80 s and 7-13 GB more each:
# it runs with ``--configs all``, every row of the matrix)
DEFAULT_CONFIGS = ",".join((
    *(f"ppqlike:{platform}:{recipe}" for platform in ("ORT_INT8", "TRT_INT8", "TPU_INT8")
      for recipe in ("recipe:plain", "default", "recipe:best")),
    "ppqlike:ORT_INT8:default+mixed_precision", "ppqlike:TRT_INT8:default+mixed_precision",
    "ort:MinMax:per_channel", "ort:Percentile:per_channel", "ort:MinMax:per_tensor",
    # the peers' rows (issue 33), where --tools names them
    *(f"{tool}:*" for tool in peers.PEER_TOOLS)))
# the setting fields each accuracy pass name turns on
ACCURACY_PASSES = {
    "equalization": {"equalization": True},
    "bias_correction": {"bias_correction": True},
    "adaround": {"adaround": True},
    "mixed_precision": {"accuracy_target": MIXED_PRECISION_COSINE},
}
ORT_METHODS = ("MinMax", "Entropy", "Percentile")
ORT_GRANULARITIES = ("per_tensor", "per_channel")
ORT_READER_BATCH = 1
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclass
class Config:
    """One row of the matrix."""

    key: str
    tool: str                 # 'ppqlike' | 'ort' | a peer of peers.PEER_TOOLS
    platform: str = ""        # ppqlike platform
    observer: str = ""        # ppqlike: 'default' or an observer name
    method: str = ""          # ort: calibration method; a peer: its variant (peers.PEER_VARIANTS)
    per_channel: bool | None = None  # ort: asked; ppqlike: filled from the platform's policy
    same_as: str | None = None       # identical to another key (not run twice)
    resolved_observer: str = ""      # ppqlike: the observer that actually runs
    passes: tuple = ()               # ppqlike: accuracy passes turned on (names of ACCURACY_PASSES)

    @property
    def label(self) -> str:
        if self.tool == "ppqlike":
            observer = self.resolved_observer or self.observer
            suffix = " (default)" if self.observer == "default" and not self.passes else ""
            return f"ppqlike {self.platform} {observer}{suffix}" + "".join(f" + {p}" for p in self.passes)
        if self.tool in peers.PEER_TOOLS:
            return peers.VARIANTS_BY_KEY[self.key].label
        return f"ORT {self.method} {'per-channel' if self.per_channel else 'per-tensor'}"


def default_observer(platform: str) -> tuple[str, bool]:
    """The activation observer and weight granularity of ``platform``'s preset setting."""
    sys.path.insert(0, str(REPO))
    from ppqlike.optim.recipe import apply_recipe, resolve_policy
    from ppqlike.optim.setting import QuantizationSettingFactory
    policy = resolve_policy(platform, apply_recipe(QuantizationSettingFactory.for_platform(platform), platform)[0])
    return policy.activation.observer, bool(policy.weight.per_channel)


def all_configs(tools=("ppqlike", "ort")) -> list[Config]:
    """Every configuration of the matrix, ppqlike first (its accuracy-pass rows after its platform
    rows), then onnxruntime's, then the peers'.  A ppqlike ``kl`` row whose platform already defaults
    to KL is marked ``same_as`` its default row."""
    configs = []
    if "ppqlike" in tools:
        for platform in PPQ_PLATFORMS:
            observer, per_channel = default_observer(platform)
            for name in PPQ_OBSERVERS:
                key = f"ppqlike:{platform}:{name}"
                resolved = observer if name == "default" else name
                same = f"ppqlike:{platform}:default" if name != "default" and name == observer else None
                configs.append(Config(key, "ppqlike", platform=platform, observer=name, per_channel=per_channel,
                                      same_as=same, resolved_observer=resolved))
        for platform, name, passes in PPQ_ACCURACY_ROWS:
            observer, per_channel = default_observer(platform)
            key = f"ppqlike:{platform}:" + "+".join((name, *passes))
            configs.append(Config(key, "ppqlike", platform=platform, observer=name, per_channel=per_channel,
                                  resolved_observer=observer if name == "default" else name, passes=passes))
    if "ort" in tools:
        for method in ORT_METHODS:
            for granularity in ORT_GRANULARITIES:
                configs.append(Config(f"ort:{method}:{granularity}", "ort", method=method,
                                      per_channel=granularity == "per_channel"))
    configs += [Config(variant.key, variant.tool, method=variant.variant, per_channel=variant.per_channel)
                for variant in peers.PEER_VARIANTS if variant.tool in tools]
    return configs


def select(configs: list[Config], patterns: str | None) -> list[Config]:
    """The configs whose key matches one of the comma-separated glob ``patterns`` (case-insensitive);
    None: ``DEFAULT_CONFIGS``; ``all``: every config."""
    if patterns is None:
        patterns = DEFAULT_CONFIGS
    if patterns.strip().lower() == "all":
        return configs
    wanted = [p.strip().lower() for p in patterns.split(",") if p.strip()]
    chosen = [c for c in configs if any(fnmatch.fnmatchcase(c.key.lower(), p) for p in wanted)]
    if not chosen:
        raise SystemExit(f"--configs {patterns!r} matches none of: {', '.join(c.key for c in configs)}")
    return chosen


# ---------------------------------------------------------------- measuring a child process

# Linux counts a child's peak RSS from the process that forked it: exec keeps the larger of the
# old address space's high-water mark and the new program's (``ru_maxrss`` after vfork/fork+exec
# starts at the parent's RSS).  The benchmark's parent holds images and sessions, so children are
# started through this tiny launcher (a bare interpreter, a few MB), which forks the real child,
# reaps it with os.wait4 and prints the measures as the last line.
_LAUNCHER = r"""
import json, os, subprocess, sys, time
command = json.loads(sys.argv[1])
started = time.perf_counter()
process = subprocess.Popen(command)
_, status, usage = os.wait4(process.pid, 0)
wall = time.perf_counter() - started
sys.stdout.flush()
print("\n@@measure " + json.dumps({"exit_code": os.waitstatus_to_exitcode(status), "wall_seconds": wall,
      "peak_rss_mb": usage.ru_maxrss / 1024.0, "cpu_seconds": usage.ru_utime + usage.ru_stime}), flush=True)
"""


def measure_child(command: list[str], log_path: Path) -> dict:
    """Run ``command`` (through the launcher above); returns its last JSON stdout line as ``child``, and
    the OS's measures of that process alone: exit code, wall seconds, peak RSS (MB), user+system CPU
    seconds.  stderr goes to ``log_path``."""
    launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(command)]
    with open(log_path, "w") as log:
        completed = subprocess.run(launcher, stdout=subprocess.PIPE, stderr=log, text=True, cwd=str(REPO))
    lines = completed.stdout.strip().splitlines()
    measures = [line for line in lines if line.startswith("@@measure ")]
    if not measures:
        return {"exit_code": completed.returncode, "wall_seconds": float("nan"), "peak_rss_mb": float("nan"),
                "cpu_seconds": float("nan"), "error": f"launcher failed (exit {completed.returncode})"}
    result = json.loads(measures[-1][len("@@measure "):])
    answers = [line for line in lines if line.startswith("{")]
    if result["exit_code"] == 0 and answers:
        result["child"] = json.loads(answers[-1])
    else:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        result["error"] = f"exit {result['exit_code']}: " + " | ".join(tail)
    return result


def child_command(spec: dict) -> list[str]:
    """The child's command line: this interpreter, or the peers' venv's for a peer's row."""
    python = str(peers.peer_python()) if spec["kind"] in peers.PEER_TOOLS else sys.executable
    return [python, str(BENCH / "run.py"), "--child", json.dumps(spec)]


# ---------------------------------------------------------------- the children

def run_child(spec: dict) -> None:
    """Entry point of a child process: dispatch on ``spec['kind']``; prints one JSON line."""
    sys.path.insert(0, str(REPO))
    kind = spec["kind"]
    runners = {"ppqlike": _quantize_ppqlike, "ort": _quantize_ort, "simulate": _simulate,
               **{tool: peers.quantize_child for tool in peers.PEER_TOOLS}}
    result = runners[kind](spec)
    print(json.dumps(result), flush=True)


class _TimedBatches:
    """Wraps the lazy calibration batches; adds up the seconds spent decoding images."""

    def __init__(self, batches):
        self.batches, self.seconds, self.images = batches, 0.0, 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        iterator = iter(self.batches)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
            self.images += len(batch)
            yield batch


def _calibration_batches(spec: dict, batch: int | None = None):
    import presets
    files = presets.image_files("calib", spec["calib_images"])
    return _TimedBatches(presets.LazyImageBatches(spec["model"], files, batch or spec["batch"]))


def _quantize_ppqlike(spec: dict) -> dict:
    import warnings

    import presets
    from ppqlike.api import export_ppq_graph, quantize_onnx_model
    from ppqlike.optim.recipe import apply_recipe, resolve_policy
    from ppqlike.optim.setting import QuantizationSettingFactory

    platform = spec["platform"]
    setting = QuantizationSettingFactory.for_platform(platform)
    if spec["observer"].startswith("recipe:"):
        setting.recipe = spec["observer"].split(":", 1)[1]
    elif spec["observer"] != "default":
        setting.activation_observer = spec["observer"]
    for name in spec.get("passes", ()):
        for field_name, value in ACCURACY_PASSES[name].items():
            setattr(setting, field_name, value)
    policy = resolve_policy(platform, apply_recipe(setting, platform)[0])
    batches = _calibration_batches(spec)
    started = time.perf_counter()
    graph = quantize_onnx_model(str(presets.PRESETS[spec["model"]].path), batches, platform=platform,
                                setting=setting)
    quantized = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_ppq_graph(graph, platform, spec["output"], config_save_to=spec["config"])
    exported = time.perf_counter()
    meta = graph.metadata["quantization"]
    fp32_ops = meta.get("mixed_precision_fp32_ops")
    target_ops = sum(op.platform.name not in ("FP32", "SOI") for op in graph.operations.values())
    return {"fp32_ops": fp32_ops, "int16_ops": meta.get("mixed_precision_int16_ops"), "target_ops": target_ops,
            "quantize_seconds": quantized - started, "export_seconds": exported - quantized,
            "decode_seconds": batches.seconds, "calibration_images": batches.images,
            "passes": {p["name"]: p["seconds"] for p in meta["passes"]},
            "observer": policy.activation.observer, "per_channel": bool(policy.weight.per_channel),
            "activation": ("asymmetric" if not policy.activation.symmetric else "symmetric")
            + (" int8" if policy.activation.signed else " uint8"),
            "warnings": sorted({" ".join(str(w.message).split()) for w in caught})}


def _quantize_ort(spec: dict) -> dict:
    import presets
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    preset = presets.PRESETS[spec["model"]]
    started = time.perf_counter()
    pre = spec["output"] + ".pre.onnx"
    quant_pre_process(str(preset.path), pre)
    preprocessed = time.perf_counter()
    # one image per get_next, as onnxruntime's examples do: its histogram collectors (Entropy,
    # Percentile) stack every batch's outputs and fail on a last batch of another size
    batches = _calibration_batches(spec, ORT_READER_BATCH)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.iterator = iter(batches)

        def get_next(self):
            batch = next(self.iterator, None)
            return None if batch is None else {preset.input_name: batch}

        def rewind(self):
            self.iterator = iter(batches)

    quantize_static(pre, spec["output"], Reader(), quant_format=QuantFormat.QDQ, per_channel=spec["per_channel"],
                    calibrate_method=getattr(CalibrationMethod, spec["method"]))
    done = time.perf_counter()
    os.unlink(pre)
    return {"preprocess_seconds": preprocessed - started, "quantize_seconds": done - preprocessed,
            "decode_seconds": batches.seconds, "calibration_images": batches.images, "reader_batch": ORT_READER_BATCH,
            "per_channel": spec["per_channel"], "activation": "asymmetric int8 (QInt8)",
            "weights": "symmetric int8 (QInt8)"}


def _simulate(spec: dict) -> dict:
    """ppqlike's simulation of the exported graph on the dev images, against onnxruntime's outputs."""
    import numpy as np

    from ppqlike.executor import NumpyExecutor
    from ppqlike.export import load_quantized_graph, output_steps
    from ppqlike.export.verify import compare_outputs

    started = time.perf_counter()
    images = np.load(spec["images"], mmap_mode="r")[:spec["count"]]
    deployed = np.load(spec["deployed"])[:spec["count"]]
    graph = load_quantized_graph(spec["source"], spec["config"])
    executor = NumpyExecutor(graph)
    output = graph.outputs[0].name
    parts = []
    for start in range(0, len(images), spec["batch"]):
        parts.append(executor.forward(np.ascontiguousarray(images[start:start + spec["batch"]]))[0])
    simulated = np.concatenate(parts).reshape(len(images), -1)
    step = output_steps(graph)[output]
    result = compare_outputs(deployed.reshape(len(images), -1), simulated, step)
    result["images"] = len(images)
    result["seconds"] = time.perf_counter() - started
    np.save(spec["simulated"], simulated)
    return result


def spec_for(config: Config, model: str, calib_images: int, batch: int, output: Path) -> dict:
    spec = {"kind": config.tool, "model": model, "calib_images": calib_images, "batch": batch,
            "output": str(output)}
    if config.tool == "ppqlike":
        spec.update(platform=config.platform, observer=config.observer, passes=list(config.passes),
                    config=str(output.with_suffix(".json")))
    elif config.tool in peers.PEER_TOOLS:
        spec.update(variant=config.method)
    else:
        spec.update(method=config.method, per_channel=bool(config.per_channel))
    return spec


def as_dict(config: Config) -> dict:
    return {**asdict(config), "label": config.label}
