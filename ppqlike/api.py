"""The user-facing functions: quantize a model, export it.

``quantize_onnx_model`` runs load → format → dispatch → platform quantizer →
pass pipeline and returns the quantized graph; ``export_ppq_graph`` writes it
for a platform.  Names follow PPQ's so that its users feel at home.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .analysis.error import graphwise_error_analyse, layerwise_error_analyse
from .analysis.verdict import quantization_verdict
from .core.compat import ignore_device, note_once, tolerant_collate
from .core.declared_names import refuse_unknown_keywords
from .core.errors import CalibrationDataError, GraphError, ModelLoadError, PlatformError, UnknownKeywordError
from .core.ir import Graph
from .core.subgraphs import has_bodies
from .executor import NumpyExecutor
from .executor.ops import check_runnable
from .export.platform import export_for_platform
from .io import load_onnx_graph
from .io.import_quantized import import_quantized
from .io.load import is_imported, load_graph as _load_graph
from .optim.batch_merge import merge_small_batches
from .optim.batch_range import BatchRange
from .optim.recipe import (apply_recipe, build_pipeline, build_weight_only_pipeline, effective_setting,
                           writes_outputs_in_float,
                           format_for_quantization, resolve_policy)
from .optim.passes.references import FloatReferences
from .optim.passes.sensitivity import measured_batches, sample_count
from .optim.setting import QuantizationSetting, QuantizationSettingFactory
from .platforms.dispatch import dispatch_graph as _dispatch_graph
from .platforms.quantizer import PlatformQuantizer
from .platforms.target import TargetPlatform
from .ppq_names import (BaseGraph, ENABLE_CUDA_KERNEL, PPQ_CONFIG, TorchExecutor, convert_any_to_numpy,
                        ppq_warning)


class _CheckedBatches:
    """Wraps the dataloader: checks every batch's names, ranks and shapes against the graph's inputs (noted
    once: the wrapper holds no graph, so a shard of it can be sent to a worker)."""

    def __init__(self, graph: Graph, dataloader: Iterable, collate_fn: Callable | None,
                 input_shape: Sequence[int] | None, inputs: Any, first_index: int = 0):
        self.graph_name = graph.name
        self.declared = [(v.name, None if v.shape is None else list(v.shape)) for v in graph.inputs]
        self.dataloader, self.collate_fn = dataloader, tolerant_collate(collate_fn)
        self.input_shape = None if input_shape is None else list(input_shape)
        self.inputs = inputs
        self.first_index = first_index   # the index of this wrapper's first batch in the user's data
        self.first = None

    def __len__(self):
        return len(self.dataloader)  # type: ignore[arg-type]

    def __iter__(self):
        for index, batch in enumerate(self.dataloader):
            batch = self.collate_fn(batch) if self.collate_fn is not None else batch
            try:
                checked = self._check(batch)
            except CalibrationDataError as error:
                raise CalibrationDataError(f"calibration batch {self.first_index + index}: {error}") from None
            if index == 0:
                self.first = checked   # for the verdict, when no batch can be held aside
            yield checked

    def calibration_shard(self, start: int, stop: int):
        """Batches ``start`` to ``stop`` checked as here, read by the user's data's own shard reader (a
        CalibrationFolder's files; see ``ppqlike.optim.distributed.file_shards``); None when it has none."""
        shard = getattr(self.dataloader, "calibration_shard", None)
        inner = None if shard is None else shard(start, stop)
        if inner is None:
            return None
        copy = object.__new__(_CheckedBatches)
        copy.__dict__.update(self.__dict__, dataloader=inner, first_index=self.first_index + start, first=None,
                             inputs=None)   # (PPQ's tracing sample: unused by the checks, not sent)
        return copy

    def _check(self, batch):
        name, declared_inputs = self.graph_name, self.declared
        names = [n for n, _ in declared_inputs]
        if isinstance(batch, dict):
            unknown = sorted(set(batch) - set(names))
            if unknown:
                raise CalibrationDataError(
                    f"a calibration batch names {unknown}, but the inputs of {name!r} are {sorted(names)}")
            missing = sorted(set(names) - set(batch))
            if missing:
                raise CalibrationDataError(f"a calibration batch lacks inputs {missing} of {name!r}")
            arrays = {k: np.asarray(v) for k, v in batch.items()}
        elif isinstance(batch, (list, tuple)) and len(names) > 1:
            if len(batch) != len(names):
                raise CalibrationDataError(f"a calibration batch has {len(batch)} arrays; {name!r} "
                                           f"has {len(names)} inputs")
            arrays = {n: np.asarray(a) for n, a in zip(names, batch)}
        else:
            if len(names) != 1:
                raise CalibrationDataError(f"{name!r} has {len(names)} inputs: give each calibration "
                                           "batch as a dict of input name -> array")
            arrays = {names[0]: np.asarray(batch)}
        for input_name, shape in declared_inputs:
            array = arrays[input_name]
            declared = shape if self.input_shape is None or len(names) > 1 else self.input_shape
            if declared is not None and array.ndim != len(declared):
                raise CalibrationDataError(
                    f"calibration input {input_name!r} must have rank {len(declared)} (shape {declared}); "
                    f"got shape {list(array.shape)}")
            for axis, (want, got) in enumerate(zip(declared or (), array.shape)):
                if axis > 0 and isinstance(want, int) and want > 0 and want != got:  # any batch size
                    raise CalibrationDataError(
                        f"calibration input {input_name!r} must have shape {declared}; got {list(array.shape)}")
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise CalibrationDataError(f"calibration input {input_name!r} holds NaN or Inf values")
        return arrays


#: ``from ppqlike.api import *`` gives a PPQ script the names ``from ppq.api import *`` gives it
__all__ = ["BaseGraph", "ENABLE_CUDA_KERNEL", "PPQ_CONFIG", "QuantizationSetting", "QuantizationSettingFactory",
           "TargetPlatform", "TorchExecutor", "convert_any_to_numpy", "dispatch_graph", "export_ppq_graph",
           "graphwise_error_analyse", "import_quantized_onnx", "layerwise_error_analyse", "load_graph", "load_onnx_graph",
           "ppq_warning", "quantize_onnx_model"]


#: with at least this many calibration batches (and no accuracy target), the last ones are held aside for the
#: verdict and the protection of sensitive layers: as many as hold ``MEASURED_SAMPLES`` samples, at most a
#: quarter of the batches (a detector calibrated image by image: 2 of 8 images, not 1)
HOLD_ASIDE_FROM = 4
MEASURED_SAMPLES = 16


def _batches_for_measures(batches: "_CheckedBatches", total: int) -> int:
    """Batches to hold aside for ``MEASURED_SAMPLES`` samples; the batch size is the data's declared
    ``batch_size`` (a CalibrationFolder, a torch DataLoader), or read from the user's first batch where the data
    is a list or tuple (one batch held aside otherwise)."""
    data = batches.dataloader
    declared = getattr(data, "batch_size", None)
    if isinstance(declared, (int, np.integer)) and not isinstance(declared, bool) and declared > 0:
        per_batch = int(declared)
    elif not isinstance(data, (list, tuple)) or not data:
        return 1
    else:
        try:
            first = data[0] if batches.collate_fn is None else batches.collate_fn(data[0])
            per_batch = sample_count(batches._check(first))
        except Exception:     # a bad batch is reported by calibration, where it is read
            return 1
    return max(1, min(total // HOLD_ASIDE_FROM, -(-MEASURED_SAMPLES // max(1, per_batch))))


def _measured_batches(held_aside, checked: _CheckedBatches) -> list:
    """What the protection and the verdict measure on: MEASURED_SAMPLES held-aside samples, or the first
    calibration batch when none could be held aside (none before calibration has read it)."""
    source = held_aside if held_aside is not None else [checked.first] if checked.first is not None else None
    return [] if source is None else measured_batches(source, MEASURED_SAMPLES)


def _held_count(batches, calib_steps: int | None, setting: QuantizationSetting) -> int:
    """How many of the last calibration batches are held aside (0: none): with an accuracy target,
    ``mixed_precision_batches`` of them, measured by the target; without one, when there are ``HOLD_ASIDE_FROM``
    batches or more, the last ones that hold ``MEASURED_SAMPLES`` samples, at most a quarter of them (the verdict
    and the protection pass measure on them).  0 when the data's length is unknown or too short (those
    measures then run on calibration batches, and their reports say so)."""
    held = setting.mixed_precision_batches if setting.accuracy_target is not None else 1
    try:
        available = len(batches)
    except TypeError:
        available = None
    total = calib_steps if calib_steps is not None else available
    if total is None or (available is not None and total > available):   # unknown, or too few (calibration says)
        return 0
    if total <= held or (setting.accuracy_target is None and total < HOLD_ASIDE_FROM):
        return 0
    return held if setting.accuracy_target is not None else _batches_for_measures(batches, total)


def _hold_aside(batches, calib_steps: int | None, setting: QuantizationSetting, held: int):
    """(calibration batches, their count, held-aside batches or None): the last ``held`` batches held aside
    (:func:`_held_count`)."""
    if not held:
        return batches, calib_steps, None
    total = calib_steps if calib_steps is not None else len(batches)
    held_aside = BatchRange(batches, total - held, total, keep=True)
    head = setting.bias_correction_samples if setting.bias_correction and setting.bias_correction_samples else 0
    return BatchRange(batches, 0, total - held, tail=held_aside, head_samples=head), total - held, held_aside


def quantize_onnx_model(onnx_import_file, calib_dataloader: Iterable, calib_steps: int | None = None,
                        input_shape: Sequence[int] | None = None,
                        platform: TargetPlatform | str = TargetPlatform.TRT_INT8, input_dtype: Any = None,
                        inputs: Any = None, setting: QuantizationSetting | None = None,
                        collate_fn: Callable | None = None, device: str | None = None, verbose: int = 0,
                        do_quantize: bool = True, dispatcher: str | None = None) -> Graph:
    """Quantize an ONNX model for ``platform`` and return the quantized graph.

    The parameters are PPQ's, in PPQ's order (``dispatcher`` is ppqlike's own, last).
    ``calib_dataloader`` yields batches (an array for single-input models, or
    a dict of input name -> array), passed through ``collate_fn`` when given;
    ``calib_steps`` batches are used (all when None; a list shorter than that
    is run again until the steps are done, as PPQ does, with one
    :class:`~ppqlike.optim.base.CalibrationRepeatWarning`).  ``input_shape`` is the
    shape of one batch, checked against the data.  ``setting`` defaults to the
    platform's preset; ``dispatcher`` overrides ``setting.dispatcher``.  The
    graph's ``metadata['quantization']`` records the platform, the setting,
    the dispatch summary and each pass's time and report.

    PPQ's keywords are accepted: ``device`` (computing is numpy on the CPU; noted once), ``input_dtype``
    (the model's declared input types are used), ``inputs`` (PPQ's tracing sample; noted, the calibration
    batches serve) and ``do_quantize`` (False: the loaded FP32 graph is
    returned, as PPQ does).
    """
    started = time.perf_counter()
    ignore_device(device, "quantize_onnx_model")
    if input_dtype is not None:
        note_once("quantize_onnx_model: input_dtype is ignored; the model's declared input types are used")
    if inputs is not None:
        note_once("quantize_onnx_model: inputs (PPQ's sample for tracing shapes) is ignored; the calibration "
                  "batches are used")
    if not do_quantize:
        return onnx_import_file if isinstance(onnx_import_file, Graph) else _load_graph(onnx_import_file)
    platform = TargetPlatform.parse(platform)
    setting = QuantizationSettingFactory.for_platform(platform) if setting is None else setting
    if dispatcher is not None:
        setting = QuantizationSetting.from_dict({**setting.to_dict(), "dispatcher": dispatcher})
    setting.validate()
    setting, recipe = apply_recipe(setting, platform)
    policy = resolve_policy(platform, setting)
    if calib_dataloader is None or isinstance(calib_dataloader, (str, bytes, np.ndarray, dict)):
        raise CalibrationDataError(
            "calib_dataloader must be an iterable of batches (e.g. a list of arrays, each [N, ...] for "
            f"single-input models, or of dicts name -> array), not {type(calib_dataloader).__name__}; "
            "wrap a single batch in a list")
    graph = onnx_import_file if isinstance(onnx_import_file, Graph) else _load_graph(onnx_import_file)
    check_runnable(graph)  # before any calibration batch is drawn
    if not graph.inputs:
        raise GraphError(f"model {graph.name!r} has no inputs: every value is a constant, so there is nothing to "
                         "calibrate or quantize; give the model its inputs (or fold it to constants)")
    if is_imported(graph):
        if setting.keep_imported_scales:
            raise PlatformError(f"model {graph.name!r} is already quantized (its scales were imported); export it "
                                "as it is with export_ppq_graph, or set setting.keep_imported_scales=False to "
                                f"recalibrate it for {platform.name} from the calibration data")
        for operation in graph.operations.values():  # recalibrate: the file's configs are dropped
            operation.config, operation.platform = None, None
    formatting = format_for_quantization(graph, setting)
    weight_only = setting.weight_only_bits is not None
    if weight_only:   # W4A16 / W8A16: only MatMul/Gemm weights are quantized, by the weight-only passes
        summary = {"weight_only": {key: value for key, value in setting.to_dict().items()
                                   if key.startswith("weight_only_")}}
    else:
        summary = _dispatch_graph(graph, platform, policy.quantizable_types, dispatcher=setting.dispatcher,
                                  dispatching_table=setting.dispatching_table or None,
                                  transformer=policy.transformer, recurrent=policy.recurrent,
                                  float_outputs=writes_outputs_in_float(graph, setting, policy))
        PlatformQuantizer(policy).quantize(graph)
    executor = NumpyExecutor(graph)
    batches = checked = _CheckedBatches(graph, calib_dataloader, collate_fn, input_shape, inputs)
    held = _held_count(batches, calib_steps, setting)
    merging = merge_small_batches(graph, executor, calib_dataloader, checked, calib_steps, held) if held else None
    if merging is not None:   # single samples (or a few) run as batches: the same per-sample results, sooner
        batches = checked = _CheckedBatches(graph, merging[0], None, None, None)
        held = merging[1]["held_aside_merged_into"]
    batches, calib_steps, held_aside = _hold_aside(batches, calib_steps, setting, held)
    if weight_only:
        pipeline = build_weight_only_pipeline(setting, platform, verbose)
    else:
        pipeline = build_pipeline(policy, setting, verbose, clock_started=started,
                                  bodies=any(has_bodies(op) for op in graph.operations.values()))
    measured = functools.cache(lambda: _measured_batches(held_aside, checked))   # read after calibration
    references = FloatReferences(graph, executor, measured)
    records = pipeline.optimize(graph, verbose=verbose, executor=executor, dataloader=batches,
                                calib_steps=calib_steps, collate_fn=None, held_aside=held_aside,
                                references=references)
    verdict = None if not measured() else quantization_verdict(graph, executor, measured(),
                                                               held_aside=held_aside is not None,
                                                               references=references)
    graph.metadata["quantization"] = {
        **graph.metadata.get("quantization", {}),  # what passes recorded (mixed_precision_fp32_ops)
        "platform": platform.name, "setting": setting.to_dict(), "dispatch": summary,
        "effective_setting": effective_setting(setting, policy), "recipe": recipe,
        "formatting": {k: str(v) for k, v in formatting.items()},
        "merged_batches": None if merging is None else merging[1],
        "passes": [{"name": r.name, "seconds": round(r.seconds, 4), "report": r.report} for r in records],
        "verdict": verdict,
        "seconds": round(time.perf_counter() - started, 3),
        "source": os.fspath(onnx_import_file) if isinstance(onnx_import_file, (str, os.PathLike)) else None,
    }
    return graph


def export_ppq_graph(graph: Graph, platform: TargetPlatform | str, graph_save_to, config_save_to=None,
                     copy_graph: bool = False, **options) -> list[str]:
    """Write a quantized graph for ``platform``; returns the absolute paths written (model first).

    Every platform gets a QDQ ONNX model at ``graph_save_to`` that onnxruntime runs and that
    computes what the executor simulates (DESIGN.md §6); TensorRT and PPL CUDA also get
    ``<model>.dynamic_range.json``, TPU-MLIR ``<model>_cali_table`` and ``<model>_qtable``; with
    ``config_save_to`` every config is written as JSON (reload it with
    ``ppqlike.export.load_quantized_graph``).  Options: ``qdq_per_consumer``,
    ``uint8_activations`` (default: the setting's ``export_*`` values), ``opset``.  Files are
    written atomically and never over the source model.  A platform whose rounding is not half
    to even warns (``ppqlike.export.ExportRoundingWarning``): the QDQ model then differs from the
    simulation on exact ties.  ``copy_graph`` (PPQ's) changes nothing: exporting never alters the graph.
    """
    return export_for_platform(graph, platform, graph_save_to, config_save_to, stacklevel=3, **options)


def import_quantized_onnx(path_or_model, platform: TargetPlatform | str | None = None,
                          restore_activations: bool = True) -> Graph:
    """Read a quantized ONNX model (QDQ or QOperator: QAT, onnxruntime's quantizer, the model zoo) as the
    FP32 graph plus configs carrying the file's scales and zero points.

    Its simulation computes what onnxruntime computes when it runs the file (the ops onnxruntime fuses
    into integer kernels are simulated as those kernels); analyse it with ``graphwise_error_analyse``,
    export it with ``export_ppq_graph``, or recalibrate it with ``quantize_onnx_model`` and
    ``setting.keep_imported_scales=False``.  ``platform`` (default ORT_INT8, what the file runs as in
    onnxruntime) is recorded on the quantized ops.  ``restore_activations`` puts back as Relu the
    activations a quantizer folded into ranges starting at zero (onnxruntime's drops Relu/Clip after
    Conv, Gemm, MatMul and Add): the quantized result is unchanged, the float graph the error analysis
    compares with is the model's again.
    """
    platform = TargetPlatform.ORT_INT8 if platform is None else TargetPlatform.parse(platform)
    return import_quantized(path_or_model, platform, restore_activations=restore_activations)


def load_graph(file_path, from_framework: Any = "ONNX", **kwargs: Any) -> Graph:
    """PPQ's ``load_graph``: the graph of an ONNX model (path, bytes or ModelProto), loaded as
    ``quantize_onnx_model`` loads it (a QDQ/QOperator file comes back with its scales imported).

    ``from_framework`` may be PPQ's ``NetworkFramework.ONNX`` or 'onnx'; any other framework (Caffe,
    PPQ's native format) is refused: ppqlike reads ONNX only.  PPQ's further keywords are Caffe's
    (``caffemodel_path``) and refused with it; any other is refused naming the closest.
    """
    framework = str(getattr(from_framework, "name", from_framework)).upper()
    if framework != "ONNX":
        raise ModelLoadError(f"load_graph({os.fspath(file_path)!r}, from_framework={framework}): ppqlike reads ONNX "
                             "models only; convert the model to ONNX first (Caffe: caffe2onnx; PPQ's native "
                             "files: load them in PPQ and export ONNX)")
    if "caffemodel_path" in kwargs:
        raise UnknownKeywordError("load_graph(caffemodel_path=...) loads a Caffe model, and ppqlike reads ONNX models "
                                  "only; convert the model to ONNX first")
    refuse_unknown_keywords(load_graph, kwargs, "load_graph()", accepted=())
    return _load_graph(file_path)


def dispatch_graph(graph: Graph, platform: TargetPlatform | str, dispatcher: Any = "conservative",
                   dispatching_table: Any = None) -> Graph:
    """PPQ's ``dispatch_graph``: label every op of ``graph`` for ``platform`` (``op.platform``: the platform,
    FP32 or SOI) with the platform's policy, as ``quantize_onnx_model`` does; returns the graph, as PPQ's
    does (the summary is ``graph.metadata['dispatch']``).

    ``dispatcher``: a name ('conservative', 'aggressive', 'pointwise', 'allin'), a ``ppqlike.lib.Dispatcher``,
    or, as PPQ's older documentation passes it third, a QuantizationSetting (its dispatcher and dispatching
    table are used).  ``dispatching_table``: {op name: platform or 'TARGET'/'FP32'/'SOI'} (ppqlike's or
    PPQ's DispatchingTable, whose ``dispatchings`` are read).  The lower-level
    :func:`ppqlike.platforms.dispatch_graph` takes the quantizable op types explicitly.
    """
    if isinstance(dispatcher, QuantizationSetting):
        setting = dispatcher
        dispatcher = setting.dispatcher
        dispatching_table = dispatching_table if dispatching_table is not None else setting.dispatching_table
    dispatcher = getattr(dispatcher, "method", dispatcher)   # ppqlike.lib.Dispatcher(graph, method)
    dispatching_table = getattr(dispatching_table, "dispatchings", dispatching_table)
    target = TargetPlatform.parse(platform)
    policy = resolve_policy(target, QuantizationSettingFactory.for_platform(target))
    graph.metadata["dispatch"] = _dispatch_graph(
        graph, target, policy.quantizable_types, dispatcher=dispatcher, dispatching_table=dispatching_table or None,
        transformer=policy.transformer, recurrent=policy.recurrent)
    return graph
