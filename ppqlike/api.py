"""The user-facing functions: quantize a model, export it.

``quantize_onnx_model`` runs load → format → dispatch → platform quantizer →
pass pipeline and returns the quantized graph; ``export_ppq_graph`` writes it
for a platform.  Names follow PPQ's so that its users feel at home.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .core.errors import CalibrationDataError
from .core.ir import Graph
from .executor import NumpyExecutor
from .io import format as graph_format
from .io import load_onnx_graph
from .optim.base import DEFAULT_PASS_REGISTRY, QuantizationOptimizationPipeline
from .optim.passes import (AdaroundPass, BiasCorrectionPass, FusionPass, IntegerRequantizationPass,
                           LayerwiseEqualizationPass, MixedPrecisionPass, ParameterBakingPass,
                           ParameterQuantizePass, PassiveParameterQuantizePass, QuantizationAlignmentPass,
                           QuantizationSimplifyPass, RuntimeCalibrationPass, RuntimeKernelPass)
from .platforms.dispatch import dispatch_graph
from .platforms.policies import get_platform_policy
from .platforms.quantizer import PlatformPolicy, PlatformQuantizer
from .platforms.target import TargetPlatform
from .setting import QuantizationSetting, QuantizationSettingFactory


def resolve_policy(platform, setting: QuantizationSetting) -> PlatformPolicy:
    """The platform's policy with the setting's overrides (observer, per-channel weights, Add alignment)."""
    policy = get_platform_policy(platform)
    changes: dict[str, Any] = {}
    if setting.activation_observer is not None:
        changes["activation"] = _replace(policy.activation, observer=setting.activation_observer)
    if setting.weight_per_channel is not None:
        changes["weight"] = _replace(changes.get("weight", policy.weight), per_channel=setting.weight_per_channel)
    if setting.add_alignment is not None:
        changes["add_alignment"] = setting.add_alignment
    return policy.with_changes(**changes) if changes else policy


def _replace(tensor_policy, **changes):
    from dataclasses import replace
    return replace(tensor_policy, **changes)


def build_pipeline(policy: PlatformPolicy, setting: QuantizationSetting, verbose: int = 0,
                   registry=DEFAULT_PASS_REGISTRY) -> QuantizationOptimizationPipeline:
    """The core pipeline for ``policy`` and ``setting``, with the registered user passes placed in it."""
    passes = []
    if setting.fusion:
        passes.append(FusionPass(policy.fused_activations))
    if setting.simplify:
        passes.append(QuantizationSimplifyPass())
    if setting.equalization:  # changes the FP32 weights: before they are quantized
        passes.append(LayerwiseEqualizationPass(setting.equalization_iterations, setting.equalization_clip,
                                                setting.equalization_max_scale))
    passes.append(ParameterQuantizePass())
    if setting.adaround:  # needs the weight scales; bakes the weights it rounds, so activations are
        # calibrated on the network as it will run (4-bit weights change the activations a lot)
        passes.append(AdaroundPass(steps=setting.adaround_steps, samples=setting.adaround_samples,
                                   inputs="float", verbose=verbose > 0))
    passes += [RuntimeCalibrationPass(search_batches=setting.search_batches, verbose=verbose > 0),
               QuantizationAlignmentPass(setting.concat_alignment, policy.add_alignment),
               PassiveParameterQuantizePass()]
    if setting.bias_correction:  # measures the error of the weights as they will be baked
        passes.append(BiasCorrectionPass(steps=setting.bias_correction_steps,
                                         new_bias="int32" if policy.bias_int32 else "float", verbose=verbose > 0))
    if setting.mixed_precision_target_cosine is not None:  # needs every other decision taken
        passes.append(MixedPrecisionPass(setting.mixed_precision_target_cosine,
                                         batches=setting.mixed_precision_batches,
                                         max_ops=setting.mixed_precision_max_ops, verbose=verbose > 0))
    if policy.integer_requantization:
        passes.append(IntegerRequantizationPass())
    if policy.runtime_kernels:
        passes.append(RuntimeKernelPass(policy.runtime_kernels))
    passes.append(ParameterBakingPass())
    return registry.apply(QuantizationOptimizationPipeline(passes))


def format_for_quantization(graph: Graph, setting: QuantizationSetting) -> dict:
    """Apply the formatting steps the setting enables; returns their reports by name."""
    reports = {}
    if setting.remove_identity:
        reports["remove_identity"] = graph_format.remove_identity(graph)
    if setting.fold_constants:
        reports["fold_constants"] = graph_format.fold_constants(graph)
    if setting.fold_batchnorm:
        reports["fold_batchnorm"] = graph_format.fold_batchnorm(graph)
    if setting.fold_bias_add:
        reports["fold_bias_add"] = graph_format.fold_bias_add(graph)
    if setting.fold_pad:
        reports["fold_pad_into_conv"] = graph_format.fold_pad_into_conv(graph)
    return reports


class _CheckedBatches:
    """Wraps the dataloader: checks every batch's names, ranks and shapes against the graph's inputs."""

    def __init__(self, graph: Graph, dataloader: Iterable, collate_fn: Callable | None,
                 input_shape: Sequence[int] | None, inputs: Any):
        self.graph, self.dataloader, self.collate_fn = graph, dataloader, collate_fn
        self.input_shape = None if input_shape is None else list(input_shape)
        self.inputs = inputs

    def __len__(self):
        return len(self.dataloader)  # type: ignore[arg-type]

    def __iter__(self):
        for index, batch in enumerate(self.dataloader):
            batch = self.collate_fn(batch) if self.collate_fn is not None else batch
            try:
                yield self._check(batch)
            except CalibrationDataError as error:
                raise CalibrationDataError(f"calibration batch {index}: {error}") from None

    def _check(self, batch):
        graph = self.graph
        if isinstance(batch, dict):
            names = {v.name for v in graph.inputs}
            unknown = sorted(set(batch) - names)
            if unknown:
                raise CalibrationDataError(
                    f"a calibration batch names {unknown}, but the inputs of {graph.name!r} are {sorted(names)}")
            missing = sorted(names - set(batch))
            if missing:
                raise CalibrationDataError(f"a calibration batch lacks inputs {missing} of {graph.name!r}")
            arrays = {k: np.asarray(v) for k, v in batch.items()}
        elif isinstance(batch, (list, tuple)) and len(graph.inputs) > 1:
            if len(batch) != len(graph.inputs):
                raise CalibrationDataError(f"a calibration batch has {len(batch)} arrays; {graph.name!r} "
                                           f"has {len(graph.inputs)} inputs")
            arrays = {v.name: np.asarray(a) for v, a in zip(graph.inputs, batch)}
        else:
            if len(graph.inputs) != 1:
                raise CalibrationDataError(f"{graph.name!r} has {len(graph.inputs)} inputs: give each calibration "
                                           "batch as a dict of input name -> array")
            arrays = {graph.inputs[0].name: np.asarray(batch)}
        for variable in graph.inputs:
            array = arrays[variable.name]
            declared = variable.shape if self.input_shape is None or len(graph.inputs) > 1 else self.input_shape
            if declared is not None and array.ndim != len(declared):
                raise CalibrationDataError(
                    f"calibration input {variable.name!r} must have rank {len(declared)} (shape {declared}); "
                    f"got shape {list(array.shape)}")
            for axis, (want, got) in enumerate(zip(declared or (), array.shape)):
                if axis > 0 and isinstance(want, int) and want > 0 and want != got:  # any batch size
                    raise CalibrationDataError(
                        f"calibration input {variable.name!r} must have shape {declared}; got {list(array.shape)}")
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise CalibrationDataError(f"calibration input {variable.name!r} holds NaN or Inf values")
        return arrays


def quantize_onnx_model(onnx_import_file, calib_dataloader: Iterable, calib_steps: int | None = None,
                        input_shape: Sequence[int] | None = None,
                        platform: TargetPlatform | str = TargetPlatform.TRT_INT8,
                        setting: QuantizationSetting | None = None, collate_fn: Callable | None = None,
                        inputs: Any = None, dispatcher: str | None = None, verbose: int = 0) -> Graph:
    """Quantize an ONNX model for ``platform`` and return the quantized graph.

    ``calib_dataloader`` yields batches (an array for single-input models, or
    a dict of input name -> array), passed through ``collate_fn`` when given;
    ``calib_steps`` batches are used (all when None).  ``input_shape`` is the
    shape of one batch, checked against the data.  ``setting`` defaults to the
    platform's preset; ``dispatcher`` overrides ``setting.dispatcher``.  The
    graph's ``metadata['quantization']`` records the platform, the setting,
    the dispatch summary and each pass's time and report.
    """
    started = time.perf_counter()
    platform = TargetPlatform.parse(platform)
    setting = QuantizationSettingFactory.for_platform(platform) if setting is None else setting
    if dispatcher is not None:
        setting = QuantizationSetting.from_dict({**setting.to_dict(), "dispatcher": dispatcher})
    setting.validate()
    policy = resolve_policy(platform, setting)
    if calib_dataloader is None or isinstance(calib_dataloader, (str, bytes, np.ndarray, dict)):
        raise CalibrationDataError(
            "calib_dataloader must be an iterable of batches (e.g. a list of arrays, each [N, ...] for "
            f"single-input models, or of dicts name -> array), not {type(calib_dataloader).__name__}; "
            "wrap a single batch in a list")
    graph = onnx_import_file if isinstance(onnx_import_file, Graph) else load_onnx_graph(onnx_import_file)
    formatting = format_for_quantization(graph, setting)
    summary = dispatch_graph(graph, platform, policy.quantizable_types, dispatcher=setting.dispatcher,
                             dispatching_table=setting.dispatching_table or None)
    PlatformQuantizer(policy).quantize(graph)
    executor = NumpyExecutor(graph)
    batches = _CheckedBatches(graph, calib_dataloader, collate_fn, input_shape, inputs)
    pipeline = build_pipeline(policy, setting, verbose)
    records = pipeline.optimize(graph, verbose=verbose, executor=executor, dataloader=batches,
                                calib_steps=calib_steps, collate_fn=None)
    graph.metadata["quantization"] = {
        **graph.metadata.get("quantization", {}),  # what passes recorded (mixed_precision_fp32_ops)
        "platform": platform.name, "setting": setting.to_dict(), "dispatch": summary,
        "formatting": {k: str(v) for k, v in formatting.items()},
        "passes": [{"name": r.name, "seconds": round(r.seconds, 4), "report": r.report} for r in records],
        "seconds": round(time.perf_counter() - started, 3),
        "source": os.fspath(onnx_import_file) if isinstance(onnx_import_file, (str, os.PathLike)) else None,
    }
    return graph


def export_ppq_graph(graph: Graph, platform: TargetPlatform | str, graph_save_to, config_save_to=None,
                     **options) -> list[str]:
    """Write a quantized graph for ``platform``; returns the absolute paths written (model first).

    Every platform gets a QDQ ONNX model at ``graph_save_to`` that onnxruntime runs and that
    computes what the executor simulates (DESIGN.md §6); TensorRT and PPL CUDA also get
    ``<model>.dynamic_range.json``, TPU-MLIR ``<model>_cali_table`` and ``<model>_qtable``; with
    ``config_save_to`` every config is written as JSON (reload it with
    ``ppqlike.export.load_quantized_graph``).  Options: ``qdq_per_consumer``,
    ``uint8_activations`` (default: the setting's ``export_*`` values), ``opset``.  Files are
    written atomically and never over the source model.  A platform whose rounding is not half
    to even warns (``ppqlike.export.ExportRoundingWarning``): the QDQ model then differs from the
    simulation on exact ties.
    """
    from .export.platform import export_for_platform  # layer-6 peer, imported on use
    return export_for_platform(graph, platform, graph_save_to, config_save_to, stacklevel=3, **options)
