"""Recipes: 'plain' is the platform's own calibration; 'balanced' fills what the setting leaves to it."""

from __future__ import annotations

import numpy as np
import pytest

import ppqlike
from ppqlike.core.errors import PlatformError
from ppqlike.optim.recipe import (ADAROUND_SHARE, RANGE_SEARCH_SHARE, RECIPES, apply_recipe, build_pipeline,
                                  resolve_policy)
from ppqlike.optim.passes.protection import LayerProtectionPass
from shared_bench import PRESETS, load_images, requires_bench


def test_plain_changes_nothing_and_balanced_fills_only_what_is_left_to_it():
    plain = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="plain")
    assert apply_recipe(plain, "ORT_INT8") == (plain, {"recipe": "plain", "changed": {}})
    balanced = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="balanced")
    applied, report = apply_recipe(balanced, "ORT_INT8")
    assert report["changed"] == {"activation_observer": RECIPES["balanced"].activation_observer,
                                 "terminal_observer": "minmax", "smooth_quant": True, "protection": True,
                                 "bias_correction": True, "bias_correction_samples": 16, "float_outputs": True}
    assert applied.activation_observer == RECIPES["balanced"].activation_observer and not applied.equalization
    explicit = ppqlike.QuantizationSettingFactory.for_platform("TRT_INT8", recipe="balanced")
    explicit.activation_observer = "kl"  # the user's choice wins over the recipe's
    explicit.smooth_quant = True
    explicit.protection = False
    explicit.float_outputs = False   # an explicit False keeps the outputs quantized with any recipe
    explicit.bias_correction = True   # on all its calibration samples: the recipe's 16 do not apply
    assert apply_recipe(explicit, "TRT_INT8") == (explicit, {"recipe": "balanced", "changed": {}})
    best, report = apply_recipe(ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="best"),
                                "ORT_INT8")
    assert report["changed"] == {"activation_observer": "auto", "terminal_observer": "minmax", "bias_correction": True,
                                 "adaround": True, "time_budget_s": RECIPES["best"].time_budget_s,
                                 "smooth_quant": True, "range_search": True, "protection": True,
                                 "float_outputs": True,
                                 "protection_front_floor": RECIPES["best"].protection_front_floor}
    explicit = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="best")
    explicit.protection_front_floor = 0.01   # the user's floor wins
    assert apply_recipe(explicit, "ORT_INT8")[0].protection_front_floor == 0.01
    for bad in (0, 1.5, True, "0.002"):
        with pytest.raises(PlatformError, match="protection_front_floor"):
            ppqlike.QuantizationSetting(protection_front_floor=bad).validate()
    budgeted = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="best")
    budgeted.time_budget_s = 5
    assert apply_recipe(budgeted, "ORT_INT8")[0].time_budget_s == 5
    with pytest.raises(PlatformError, match="recipe"):
        ppqlike.QuantizationSetting(recipe="fastest")
    with pytest.raises(PlatformError, match="time_budget_s"):
        ppqlike.QuantizationSetting(time_budget_s=-1)


def test_the_recipe_names_agree_wherever_they_are_listed():
    from ppqlike.cli.main import build_parser
    from ppqlike.optim.setting import _RECIPES
    quantize = build_parser()._subparsers._group_actions[0].choices["quantize"]
    recipe_option = next(a for a in quantize._actions if "--recipe" in a.option_strings)
    assert tuple(RECIPES) == _RECIPES == tuple(recipe_option.choices)


@requires_bench
@pytest.mark.real_model
def test_balanced_is_not_worse_than_plain_on_per_layer_snr():
    images, _, _ = load_images("mobilenetv2", "calib", 12)
    calibration, held = [images[:4], images[4:8]], [images[8:12]]
    mean_snr = {}
    for recipe in ("plain", "balanced"):
        setting = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe=recipe)
        graph = ppqlike.quantize_onnx_model(str(PRESETS["mobilenetv2"].path), calibration, platform="ORT_INT8",
                                            setting=setting)
        assert graph.metadata["quantization"]["recipe"]["recipe"] == recipe
        analysis = ppqlike.graphwise_error_analyse(graph, held, verbose=False)
        mean_snr[recipe] = np.mean([v for v in analysis.values() if np.isfinite(v)])
    assert mean_snr["balanced"] >= mean_snr["plain"] - 0.1, mean_snr


@requires_bench
@pytest.mark.real_model
def test_best_learns_the_rounding_of_8bit_weights_on_a_real_model():
    images, _, _ = load_images("squeezenet1.1", "calib", 8)
    setting = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="best")
    setting.adaround_steps, setting.adaround_samples = 60, 512
    graph = ppqlike.quantize_onnx_model(str(PRESETS["squeezenet1.1"].path), [images[:4], images[4:]],
                                        platform="ORT_INT8", setting=setting)
    passes = {p["name"]: p["report"] for p in graph.metadata["quantization"]["passes"]}
    assert {"adaround", "range_search", "bias_correction"} <= set(passes)
    assert graph.metadata["quantization"]["recipe"]["recipe"] == "best"
    names = [p["name"] for p in graph.metadata["quantization"]["passes"]]
    assert names.index("adaround") < names.index("calibration") < names.index("range_search") \
        < names.index("bias_correction")
    # (11 per-tensor ranges, less the GlobalAveragePool's output: it writes the logits in float, float_outputs)
    assert passes["range_search"]["searched"] == 10 and not passes["range_search"]["budget_spent"]
    rounding = passes["adaround"]
    assert rounding["layers"] == 26 and rounding["improved"] > 13
    assert rounding["mean_relative_error_learned"] < rounding["mean_relative_error_nearest"]


def test_the_time_budget_runs_from_the_call_and_each_pass_stops_at_its_share():
    setting, _ = apply_recipe(ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="best"), "ORT_INT8")
    assert setting.time_budget_s == 240.0
    started = 1000.0   # a perf_counter() value: the moment quantize_onnx_model was called
    pipeline = build_pipeline(resolve_policy("ORT_INT8", setting), setting, clock_started=started)
    passes = {p.name: p for p in pipeline.passes}
    assert passes["adaround"].time_budget_s.deadline() == started + 240.0 * ADAROUND_SHARE
    assert passes["range_search"].time_budget.deadline() == started + 240.0 * RANGE_SEARCH_SHARE
    assert passes["bias_correction"].time_budget.deadline() == started + 240.0
    unbounded = build_pipeline(resolve_policy("ORT_INT8", setting), ppqlike.QuantizationSetting(recipe="plain"))
    assert all(getattr(p, "time_budget", None) is None or p.time_budget.deadline() == float("inf")
               for p in unbounded.passes)


def test_best_protects_before_it_searches_ranges_and_checks_the_search():
    """With the range search and the protection both on (best), the protection moves first and the search
    refines what stays on 8 bits, checked on the held-aside samples; balanced keeps its order."""
    from ppqlike.optim.recipe import build_pipeline, resolve_policy
    for platform in ("ORT_INT8", "TRT_INT8", "TPU_INT8"):
        best, _ = apply_recipe(ppqlike.QuantizationSettingFactory.for_platform(platform, recipe="best"), platform)
        passes = build_pipeline(resolve_policy(platform, best), best).passes
        names = [p.name for p in passes]
        assert names.index("protection") < names.index("range_search") < names.index("bias_correction")
        assert names.count("protection") == 1
        assert next(p for p in passes if p.name == "range_search").checked_on
        # a front moves from a smaller held-aside error than in balanced (RECIPES, round 16)
        front_floor = next(p for p in passes if p.name == "protection").front_floor
        assert front_floor == RECIPES["best"].protection_front_floor < LayerProtectionPass().front_floor
        balanced, _ = apply_recipe(ppqlike.QuantizationSettingFactory.for_platform(platform), platform)
        names = [p.name for p in build_pipeline(resolve_policy(platform, balanced), balanced).passes]
        assert "range_search" not in names and names.index("bias_correction") < names.index("protection")
        protection = next(p for p in build_pipeline(resolve_policy(platform, balanced), balanced).passes
                          if p.name == "protection")
        assert protection.front_floor == LayerProtectionPass().front_floor
