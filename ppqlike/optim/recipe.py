"""The recipe: from a setting and a platform to the policy in effect, the formatting steps and the passes.

One place says what a quantization run does: :func:`resolve_policy` (the
platform's policy with the setting's overrides), :func:`format_for_quantization`
(the graph formatting the setting enables) and :func:`build_pipeline` (the
passes, in order: refine, [smooth quant], [placement], fusion, simplify, [equalization], parameter,
[AdaRound], calibration, alignment, passive, [reconstruction], [range search], [bias correction],
[protection], [mixed precision], [integer requantization], [runtime kernels], baking; with the range search,
the protection runs right before it and the search is kept only where the held-aside error falls).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core.ir import Graph
from ..io import format as graph_format
from ..platforms.policies import get_platform_policy
from ..platforms.quantizer import PlatformPolicy
from .base import DEFAULT_PASS_REGISTRY, QuantizationOptimizationPipeline, TimeBudget
from .passes import (ActivationRangeSearchPass, AdaroundPass, BiasCorrectionPass, BlockReconstructionPass,
                     BodyQuantizationPass, FusionPass, Int32BiasRangePass,
                     IntegerRequantizationPass, LayerProtectionPass, LayerwiseEqualizationPass, MixedPrecisionPass, ParameterBakingPass,
                     ParameterQuantizePass, PassiveParameterQuantizePass, QuantizationAlignmentPass,
                     QuantizationPlacementPass,
                     QuantizationSimplifyPass, QuantizeRefinePass, RuntimeCalibrationPass, RuntimeKernelPass,
                     SmoothQuantPass)
from .passes import AWQPass, GPTQPass, WeightOnlyQuantizePass
from .passes.placement import graph_placement
from .recipe_table import RECIPES, Recipe, apply_recipe
from .setting import QuantizationSetting

__all__ = ["RECIPES", "Recipe", "apply_recipe", "resolve_policy", "build_pipeline", "format_for_quantization",
           "build_weight_only_pipeline", "writes_outputs_in_float"]


def resolve_policy(platform, setting: QuantizationSetting) -> PlatformPolicy:
    """The platform's policy with the setting's overrides (observer, per-channel weights, Add alignment, the
    recurrent ops' treatment, the placement)."""
    policy = get_platform_policy(platform)
    changes: dict[str, Any] = {}
    if setting.activation_observer is not None and policy.activation.observer != "unit":   # (unit: FP16/BF16
        changes["activation"] = replace(policy.activation, observer=setting.activation_observer)  # casts, no range)
    if setting.weight_per_channel is not None:
        changes["weight"] = replace(policy.weight, per_channel=setting.weight_per_channel)
    if setting.add_alignment is not None:
        changes["add_alignment"] = setting.add_alignment
    if setting.recurrent is not None:
        changes["recurrent"] = setting.recurrent
    if setting.placement is not None:   # for every graph, transformers included
        changes["placement"], changes["transformer_placement"] = setting.placement, None
    return policy.with_changes(**changes) if changes else policy


def writes_outputs_in_float(graph: Graph, setting: QuantizationSetting, policy: PlatformPolicy) -> bool:
    """Whether the ops writing ``graph``'s outputs are dispatched FP32 (``setting.float_outputs``): where the
    placement quantizes every op's outputs (TensorRT's leaves them float already) on an integer grid (a
    float-format platform's outputs keep their format)."""
    return bool(setting.float_outputs) and policy.activation.float_format is None and graph_placement(
        graph, policy.placement, policy.transformer_placement) == "every_output"


def effective_setting(setting: QuantizationSetting, policy: PlatformPolicy) -> dict:
    """The setting as it ran: each None ("the platform's default") replaced by the value used, as
    ``{key: value}`` plus ``'platform_defaults'``, the keys whose value came from the platform."""
    values = setting.to_dict()
    used = {"activation_observer": policy.activation.observer, "weight_per_channel": policy.weight.per_channel,
            "add_alignment": policy.add_alignment, "recurrent": policy.recurrent, "placement": policy.placement,
            "export_uint8_activations": False,
            "export_qdq_per_consumer": False, "export_uint8_weights": policy.runtime_kernels == "onnxruntime"}
    defaults = sorted(key for key, value in used.items() if values.get(key) is None)
    for key in defaults:
        values[key] = used[key]
    return {**values, "platform_defaults": defaults}


#: shares of ``setting.time_budget_s`` at which learned rounding and the range search stop (the range search
#: leaves the rest to bias correction, the protection and the verdict: with `best` on MobileNetV2, ORT_INT8,
#: 100 calibration images, on this 2-core machine, those took 9 s, 9 s and ~5 s, 10% of the 240 s budget)
ADAROUND_SHARE = 0.6
RANGE_SEARCH_SHARE = 0.85
#: with the block reconstruction: learned rounding on FP32 inputs stops at the first share, the
#: reconstruction (which learns every block's rounding again, fewer steps where its share of the time left is
#: short) at the second
ADAROUND_SHARE_BEFORE_RECONSTRUCTION = 0.3
RECONSTRUCTION_SHARE = 0.8
#: samples bias correction and the range search are checked on (each kept only where it brings the output closer
#: to FP32): the protection's, so that all three read the same FP32 references
CHECK_SAMPLES = 16


def build_pipeline(policy: PlatformPolicy, setting: QuantizationSetting, verbose: int = 0,
                   registry=DEFAULT_PASS_REGISTRY, bodies: bool = False,
                   clock_started: float | None = None) -> QuantizationOptimizationPipeline:
    """The pipeline for ``policy`` and ``setting``, with the registered user passes placed in it; ``bodies``
    (the graph has If/Loop/Scan): their bodies' ops are quantized before calibration (``passes.bodies``), so
    that the enclosing graph is calibrated on what the quantized bodies compute.

    ``setting.time_budget_s`` runs from ``clock_started`` (a ``time.perf_counter()`` value; quantize_onnx_model
    passes the moment it was called) or from the first pass that asks: learned rounding stops at
    ``ADAROUND_SHARE`` of it, the range search at ``RANGE_SEARCH_SHARE`` when passes follow it, bias correction
    at the end; the protection and the accuracy target, which decide what runs at which precision, are not cut
    short (their seconds are in the budget's clock all the same)."""
    passes = [QuantizeRefinePass(policy)]
    float_boundaries = "compute_inputs" in (policy.placement, policy.transformer_placement)
    if setting.smooth_quant:  # changes the FP32 weights (and LayerNorm gamma/beta), may insert Muls: before the
        # placement reads which tensors the computing ops read, and before the weights are quantized
        passes.append(SmoothQuantPass(alpha=setting.smooth_quant_alpha, verbose=verbose > 0,
                                      insert_multiplies=float_boundaries))
    if float_boundaries:
        passes.append(QuantizationPlacementPass(policy.placement, policy.transformer_placement))
    budget = TimeBudget(setting.time_budget_s, started=clock_started)  # shared by the passes that stop at it
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
                                   inputs="float", verbose=verbose > 0,
                                   # leave part of the budget to the range search, which gains more on some models
                                   time_budget_s=budget.part(ADAROUND_SHARE_BEFORE_RECONSTRUCTION
                                                             if setting.reconstruction else ADAROUND_SHARE)
                                   if setting.range_search or setting.reconstruction else budget,
                                   backend=setting.calibration_backend, workers=setting.calibration_workers))
    if bodies:
        passes.append(BodyQuantizationPass(policy, setting, build_pipeline, format_for_quantization, verbose=verbose > 0))
    passes += [RuntimeCalibrationPass(search_batches=setting.search_batches, verbose=verbose > 0,
                                      backend=setting.calibration_backend, workers=setting.calibration_workers,
                                      terminal_observer=setting.terminal_observer,
                                      unsigned_non_negative=policy.activation.unsigned_non_negative),
               QuantizationAlignmentPass(setting.concat_alignment, policy.add_alignment),
               PassiveParameterQuantizePass()]
    if policy.bias_int32:  # before the passes that measure errors: they see biases that fit
        passes.append(Int32BiasRangePass())
    if setting.reconstruction:  # needs the activations calibrated; the range search then sees its weights
        followed = setting.range_search or setting.bias_correction or setting.protection or \
            setting.accuracy_target is not None
        passes.append(BlockReconstructionPass(samples=setting.reconstruction_samples, rows=setting.adaround_samples,
                                              steps=setting.reconstruction_steps,
                                              verbose=verbose > 0,
                                              time_budget=budget.part(RECONSTRUCTION_SHARE) if followed else budget))
    protection = LayerProtectionPass(higher_precision_bits=policy.higher_precision_bits,
                                     float_boundaries=policy.placement == "compute_inputs", verbose=verbose > 0,
                                     float_fronts=policy.wider_grid_runs_float,
                                     front_floor=setting.protection_front_floor)
    protection_first = setting.range_search and setting.protection
    if setting.range_search:  # needs every range calibrated; bias correction then measures what is left
        followed = setting.bias_correction or setting.protection or setting.accuracy_target is not None
        if protection_first:   # the search refines the ranges of what stays on 8 bits (RECIPES, round 11)
            passes.append(protection)
        passes.append(ActivationRangeSearchPass(samples=setting.range_search_samples, verbose=verbose > 0,
                                                time_budget=budget.part(RANGE_SEARCH_SHARE) if followed else budget,
                                                checked_on=CHECK_SAMPLES if protection_first else None))
        if policy.bias_int32:  # again: the search moved input scales, before bias correction bakes biases
            passes.append(Int32BiasRangePass())
    if setting.bias_correction:  # measures the error of the weights as they will be baked; before the
        # protection, which measures every move on the corrected graph (a float bias keeps its correction
        # when its layer moves to FP32; the move stays only where the whole graph gains).  Measured the other
        # way round (protection first): SqueezeNet TRT_INT8 dev cosine 0.99296 -> 0.98987 (the corrected
        # graph's error makes MaxPool_2 worth protecting), PicoDet TPU 0.94542 -> 0.94699, others within 3e-4
        passes.append(BiasCorrectionPass(steps=setting.bias_correction_steps, time_budget=budget,
                                         samples=setting.bias_correction_samples,
                                         new_bias="int32" if policy.bias_int32 else "float", verbose=verbose > 0,
                                         scope=setting.bias_correction_scope,
                                         checked_on=CHECK_SAMPLES))
    if setting.protection and not protection_first:  # after the passes that change configs, before the
        passes.append(protection)                      # accuracy target
    if setting.accuracy_target is not None:  # needs every other decision taken
        passes.append(MixedPrecisionPass(setting.accuracy_target,
                                         batches=setting.mixed_precision_batches,
                                         max_ops=setting.mixed_precision_max_ops, verbose=verbose > 0,
                                         higher_precision_bits=policy.higher_precision_bits,
                                         backend=setting.calibration_backend, workers=setting.calibration_workers))
    if policy.bias_int32 and (setting.accuracy_target is not None or setting.protection):
        passes.append(Int32BiasRangePass())  # again: moving ops off 8 bits made new weight scales
    if policy.integer_requantization:
        passes.append(IntegerRequantizationPass())
    if policy.runtime_kernels:
        passes.append(RuntimeKernelPass(policy.runtime_kernels))
    passes.append(ParameterBakingPass())
    return registry.apply(QuantizationOptimizationPipeline(passes))


def build_weight_only_pipeline(setting: QuantizationSetting, platform,
                               verbose: int = 0) -> QuantizationOptimizationPipeline:
    """The weight-only pipeline (``setting.weight_only_bits`` set): GPTQ or AWQ where the setting's
    ``weight_only_method`` says, then nearest rounding of every weight they left (all of them for 'rtn');
    the activations stay float, so no calibration, alignment or baking pass runs (nor the registered user
    passes, which are placed relative to those)."""
    options = {"bits": setting.weight_only_bits, "block_size": setting.weight_only_block_size,
               "symmetric": setting.weight_only_symmetric, "platform": platform}
    passes = []
    if setting.weight_only_method == "gptq":
        passes.append(GPTQPass(**options, verbose=verbose > 0))
    elif setting.weight_only_method == "awq":
        passes.append(AWQPass(**options, verbose=verbose > 0))
    passes.append(WeightOnlyQuantizePass(**options))
    return QuantizationOptimizationPipeline(passes)


def format_for_quantization(graph: Graph, setting: QuantizationSetting) -> dict:
    """Apply the formatting steps the setting enables; returns their reports by name."""
    reports = {}
    if setting.remove_identity:
        reports["remove_identity"] = graph_format.remove_identity(graph)
    if setting.fold_constants:
        reports["fold_constants"] = graph_format.fold_constants(graph)
        if any(op.type == "Loop" for op in graph.operations.values()):
            reports["fold_loop_invariants"] = graph_format.fold_loop_invariants(graph)
    wanted = {graph_format.fold_batchnorm: setting.fold_batchnorm,
              graph_format.fold_scale_mul: setting.fold_scale_mul, graph_format.fold_bias_add: setting.fold_bias_add}
    folds = [fold for fold in graph_format.FOLLOWER_FOLDS if wanted[fold]]   # in the order fold_followers has
    if folds:
        reports["fold_followers"] = graph_format.fold_followers(graph, folds)
    if setting.fold_pad:
        reports["fold_pad_into_conv"] = graph_format.fold_pad_into_conv(graph)
    return reports
