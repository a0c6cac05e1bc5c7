"""Settings refuse what they do not know: a misspelled attribute, option or keyword raises UnknownSettingError (a
PPQLikeError and an AttributeError) naming it and the closest valid names, before anything runs.

Every public setting object is enumerated here (the flat setting from each preset, each of PPQ's nested views,
the dispatching table, PPQ_CONFIG, the exporters' options, every pass constructor), and a scan of the package
fails when a new setting-like class or pass escapes the check.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import os
import pickle
import pkgutil
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ppqlike
from ppqlike.core.declared_names import DeclaredAttributes, _keyword_parameters
from ppqlike.core.errors import (ExportError, PlatformError, PPQLikeError, UnknownExportOptionError,
                                 UnknownKeywordError, UnknownSettingError)
from ppqlike.optim.base import QuantizationOptimizationPass
from ppqlike.optim.ppq_setting import NESTED, SWITCHES, DispatchingTable, SettingView
from ppqlike.optim.setting import QuantizationSetting, QuantizationSettingFactory

pytestmark = pytest.mark.filterwarnings("ignore::ppqlike.core.compat.PPQCompatibilityWarning")

DEMO = os.path.join(os.path.dirname(ppqlike.__file__), "data", "demo_model.onnx")
PRESETS = ("default_setting", "trt_setting", "ort_setting", "tpu_setting", "dsp_setting", "tidl_setting",
           "academic_setting", "pplcuda_setting", "nxp_setting", "fpga_setting", "ncnn_setting")


def misspelled(name: str) -> str:
    """``name`` with its middle character dropped (a typo no declared name equals; checked by the callers)."""
    middle = len(name) // 2
    return name[:middle] + name[middle + 1:]


def suggested(message: str) -> list[str]:
    """The names after 'did you mean' in an error message."""
    found = re.search(r"did you mean (.*?)\?", message)
    return re.findall(r"'([^']*)'", found.group(1)) if found else []


def expect_refused(assign, name: str, closest: str | None, kind=UnknownSettingError) -> UnknownSettingError:
    """``assign()`` raises ``kind`` (a PPQLikeError and an AttributeError) naming ``name`` and suggesting
    ``closest`` (None: no suggestion, but the list of valid names)."""
    with pytest.raises(kind) as caught:
        assign()
    error = caught.value
    assert isinstance(error, PPQLikeError) and isinstance(error, AttributeError)
    message = str(error)
    assert repr(name) in message and error.name == name
    if closest is None:
        assert "did you mean" not in message
    else:
        assert closest in suggested(message), message
    return error


# ------------------------------------------------------------------- the flat setting --
def test_the_issues_own_cases():
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    before = setting.to_dict()
    error = expect_refused(lambda: setattr(setting, "smoothquant", True), "smoothquant", "smooth_quant")
    assert isinstance(error, PlatformError)  # settings' errors are PlatformErrors, as the JSON loader's
    assert str(error).startswith("QuantizationSetting has no attribute 'smoothquant'; did you mean 'smooth_quant'")
    error = expect_refused(lambda: setattr(setting, "frobnicate_level", 4), "frobnicate_level", None)
    assert "valid attributes are ['accuracy_target', " in str(error)
    assert setting.to_dict() == before and "smoothquant" not in vars(setting)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_field_of_every_preset_misspelled_names_the_field(preset):
    setting = getattr(QuantizationSettingFactory, preset)()
    declared = setting._declared_attributes()
    assert set(QuantizationSetting.__dataclass_fields__) | set(SWITCHES) <= set(declared)
    for field in QuantizationSetting.__dataclass_fields__:
        typo = misspelled(field)
        assert typo not in declared
        expect_refused(lambda: setattr(setting, typo, getattr(setting, field)), typo, field)
        expect_refused(lambda: getattr(setting, typo), typo, field)  # reading says the same
    assert setting == getattr(QuantizationSettingFactory, preset)()


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z][a-z0-9_]{0,24}", fullmatch=True))
def test_any_undeclared_name_is_refused_and_changes_nothing(name):
    setting = QuantizationSetting()
    if name in setting._declared_attributes() or name in NESTED:
        return
    with pytest.raises(UnknownSettingError, match=re.escape(f"has no attribute {name!r}")):
        setattr(setting, name, 1)
    assert setting == QuantizationSetting() and name not in vars(setting)


def test_json_loader_suggests_too():
    with pytest.raises(UnknownSettingError, match=r"unknown setting keys \['smoothquant'\]; did you mean "
                                                  r"'smooth_quant'") as caught:
        QuantizationSetting.from_dict({"smoothquant": True})
    assert isinstance(caught.value, PlatformError)
    assert "valid keys are [" in str(caught.value)


def test_replacing_a_nested_view_is_refused():
    setting = QuantizationSetting()
    with pytest.raises(UnknownSettingError, match="equalization_setting is PPQ's nested setting"):
        setting.equalization_setting = object()
    assert setting == QuantizationSetting()


# ---------------------------------------------------------------- PPQ's nested views --
@pytest.mark.parametrize("view", sorted(NESTED))
def test_every_nested_view_attribute_misspelled_names_it(view):
    setting = QuantizationSetting()
    nested = getattr(setting, view)
    assert isinstance(nested, SettingView) and isinstance(nested, DeclaredAttributes)
    for attribute in NESTED[view]:
        typo = misspelled(attribute)
        assert typo not in NESTED[view]
        error = expect_refused(lambda: setattr(nested, typo, 1), typo, attribute)
        assert str(error).startswith(f"QuantizationSetting.{view} has no attribute {typo!r}")
        expect_refused(lambda: getattr(nested, typo), typo, attribute)
    expect_refused(lambda: setattr(nested, "weight_only_bits", 4), "weight_only_bits", None)
    assert setting == QuantizationSetting()


def test_nested_views_still_write_and_validate():
    setting = QuantizationSetting()
    setting.equalization_setting.iterations = 3
    setting.lsq_optimization_setting.lr = 1e-3  # PPQ's, no counterpart: accepted and noted
    assert setting.equalization_iterations == 3
    with pytest.raises(PlatformError, match="equalization_iterations must be an integer"):
        setting.equalization_setting.iterations = "3"


# ------------------------------------------------------ dispatching table and PPQ_CONFIG --
def test_dispatching_table_has_no_attributes_to_set():
    setting = QuantizationSetting()
    table = setting.dispatching_table
    assert isinstance(table, DispatchingTable) and isinstance(table, DeclaredAttributes)
    error = expect_refused(lambda: setattr(table, "dispatchings", {"conv": "FP32"}), "dispatchings", None)
    assert "there are no valid attributes" in str(error) and "table[op_name] = 'FP32'" in str(error)
    table.append("conv", ppqlike.TargetPlatform.FP32)
    table["relu"] = "TARGET"
    assert setting.dispatching_table == {"conv": "FP32", "relu": "TARGET"}
    setting.dispatching_table = {"gemm": "FP32"}  # a plain dict becomes a table, which refuses too
    expect_refused(lambda: setattr(setting.dispatching_table, "dispatchings", {}), "dispatchings", None)


def test_ppq_config_refuses_a_misspelling():
    from ppqlike import PPQ_CONFIG
    assert PPQ_CONFIG.USING_CUDA_KERNEL is False
    expect_refused(lambda: setattr(PPQ_CONFIG, "USING_CUDA_KERNELS", False), "USING_CUDA_KERNELS",
                   "USING_CUDA_KERNEL")
    PPQ_CONFIG.PPQ_DEBUG = False  # PPQ's own names are accepted


# ------------------------------------------------------------------- exporter options --
@pytest.fixture(scope="module")
def demo_graph():
    return ppqlike.load_onnx_graph(DEMO)


def test_export_options_are_refused_with_a_suggestion_before_anything_is_written(demo_graph, tmp_path):
    from ppqlike import lib as PFL
    from ppqlike.export import export_for_platform, verify_export
    calls = {
        "export_for_platform": lambda: export_for_platform(demo_graph, "TRT_INT8", tmp_path / "x.onnx",
                                                           per_consumer=True),
        "export_ppq_graph": lambda: ppqlike.export_ppq_graph(demo_graph, "TRT_INT8", tmp_path / "x.onnx",
                                                             per_consumer=True),
        "PFL.Exporter": lambda: PFL.Exporter("TRT_INT8").export(tmp_path / "x.onnx", demo_graph, per_consumer=True),
    }
    for call in calls.values():  # the graph is not quantized: the option is refused before that is found
        error = expect_refused(call, "per_consumer", "qdq_per_consumer", UnknownExportOptionError)
        assert isinstance(error, ExportError) and isinstance(error, TypeError)
        assert "unknown export option" in str(error)
    error = expect_refused(lambda: verify_export(demo_graph, {}, uint8_activation=True), "uint8_activation",
                           "uint8_activations", UnknownExportOptionError)
    assert "verify_export() got an unknown keyword 'uint8_activation'" in str(error)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- pass constructors --
def _ppqlike_modules():
    for info in pkgutil.walk_packages(ppqlike.__path__, "ppqlike."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def _classes():
    seen = {}
    for module in _ppqlike_modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__.startswith("ppqlike.") and value.__module__ == module.__name__:
                seen[f"{value.__module__}.{value.__qualname__}"] = value
    return seen


CLASSES = _classes()
PASSES = {name: cls for name, cls in CLASSES.items()
          if issubclass(cls, QuantizationOptimizationPass) and cls is not QuantizationOptimizationPass}


def test_the_scan_finds_the_passes_and_settings():
    names = {cls.__name__ for cls in PASSES.values()}
    assert {"LayerwiseEqualizationPass", "AdaRoundPass", "AdaroundPass", "RuntimeCalibrationPass",
            "QuantAlignmentPass", "SmoothQuantPass", "LearnedStepSizePass"} <= names
    assert len(PASSES) >= 25


def test_every_setting_like_class_refuses_undeclared_attributes():
    """A class named as a setting, option set or table (a new one added later included) must refuse
    undeclared attributes; the factory is the only one with nothing to set."""
    exempt = {"ppqlike.optim.setting.QuantizationSettingFactory"}
    setting_like = [name for name, cls in CLASSES.items()
                    if re.search(r"Setting|Options?$|Table$", cls.__name__) and name not in exempt
                    and not issubclass(cls, BaseException)]
    assert "ppqlike.optim.setting.QuantizationSetting" in setting_like
    for name in setting_like:
        assert issubclass(CLASSES[name], DeclaredAttributes), name


@pytest.mark.parametrize("name", sorted(PASSES))
def test_every_pass_constructor_refuses_a_misspelled_keyword(name):
    cls = PASSES[name]
    named, takes_any = _keyword_parameters(cls.__init__)
    assert not takes_any or cls.accepted_keywords is not None, f"{name} takes any keyword: list accepted_keywords"
    known = named | set(cls.accepted_keywords or ())
    for keyword in sorted(known) or ["iterations"]:
        typo = misspelled(keyword) if known else keyword
        if typo in known:
            continue
        error = expect_refused(lambda: cls(**{typo: 1}), typo, keyword if known else None, UnknownKeywordError)
        assert isinstance(error, TypeError)  # as Python's own unknown-keyword error
        assert str(error).startswith(f"{cls.__name__}() got an unknown keyword {typo!r}")
        if not known:
            assert "there are no valid keywords" in str(error)


def test_ppq_passes_take_ppqs_keywords_and_refuse_others(monkeypatch):
    from ppqlike.core import compat
    from ppqlike.quantization.optim import LayerwiseEqualizationPass, LearnedStepSizePass, QuantAlignmentPass
    monkeypatch.setattr(compat, "_SAID", set())  # every note is said anew
    with pytest.warns(compat.PPQCompatibilityWarning, match="value_threshold"):
        equalization = LayerwiseEqualizationPass(iterations=4, value_threshold=0.5, interested_layers=[])
    assert equalization.iterations == 4
    expect_refused(lambda: LayerwiseEqualizationPass(iteration=4), "iteration", "iterations", UnknownKeywordError)
    QuantAlignmentPass(elementwise_alignment="Align to Large", resize_alignment="None")
    expect_refused(lambda: QuantAlignmentPass(elementwise_aligment="None"), "elementwise_aligment",
                   "elementwise_alignment", UnknownKeywordError)
    with pytest.raises(PlatformError, match="AdaRoundPass"):
        LearnedStepSizePass(steps=10)


def test_pfl_dispatch_refuses_a_misspelled_keyword(demo_graph):
    from ppqlike import lib as PFL
    dispatcher = PFL.Dispatcher(copy.deepcopy(demo_graph))
    expect_refused(lambda: dispatcher.dispatch({"Conv"}, quant_platfrom=None), "quant_platfrom", "quant_platform",
                   UnknownKeywordError)
    table = dispatcher.dispatch({"Conv", "Gemm"}, quant_platform=ppqlike.TargetPlatform.TRT_INT8)
    assert isinstance(table, DispatchingTable) and table


# --------------------------------------------------- what keeps working as before --
def test_reading_unknown_and_private_attributes_behaves_as_python():
    setting = QuantizationSetting()
    assert getattr(setting, "smoothquant", "absent") == "absent" and not hasattr(setting, "smoothquant")
    with pytest.raises(AttributeError) as caught:
        setting._cache
    assert not isinstance(caught.value, UnknownSettingError)
    setting._cache = {"seen": 1}  # private attributes are the object's own business
    assert setting._cache == {"seen": 1}
    view = setting.equalization_setting
    view._note = 2
    assert view._note == 2
    setting.dispatching_table._origin = "user"
    assert setting.dispatching_table._origin == "user"


def test_valid_assignments_still_validate_as_before():
    setting = QuantizationSetting()
    setting.smooth_quant = True
    setting.bias_correct = True  # PPQ's switch, onto bias_correction
    assert setting.smooth_quant and setting.bias_correction
    setting.equalization_iterations = 0  # assignment stores; validate() (run before quantizing) refuses
    with pytest.raises(PlatformError, match="equalization_iterations must be a positive integer"):
        setting.validate()
    setting.equalization_iterations = 10
    setting.recipe = "fast"
    with pytest.raises(PlatformError, match="setting.recipe 'fast' is unknown"):
        setting.validate()
    with pytest.raises(PlatformError, match="setting.fusion must be true or false"):
        QuantizationSetting(fusion="yes")


def test_pickle_copy_json_and_cloudpickle_round_trips_keep_the_check(tmp_path):
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.smooth_quant, setting.equalization_setting.iterations = True, 4
    setting.dispatching_table.append("conv", ppqlike.TargetPlatform.FP32)
    copies = [pickle.loads(pickle.dumps(setting)), copy.copy(setting), copy.deepcopy(setting),
              QuantizationSetting.from_dict(setting.to_dict()),
              QuantizationSetting.from_dict(json.loads(json.dumps(setting.to_dict())))]
    cloudpickle = pytest.importorskip("cloudpickle")  # Ray's serializer
    copies.append(cloudpickle.loads(cloudpickle.dumps(setting)))
    setting.save(tmp_path / "setting.json")
    copies.append(QuantizationSetting.load(tmp_path / "setting.json"))
    for other in copies:
        assert other == setting and type(other.dispatching_table) is DispatchingTable
        expect_refused(lambda: setattr(other, "smoothquant", True), "smoothquant", "smooth_quant")
        expect_refused(lambda: setattr(other.dispatching_table, "x", 1), "x", None)


def test_a_setting_configured_by_attribute_quantizes_the_demo_model():
    setting = QuantizationSettingFactory.for_platform("TRT_INT8", recipe="plain")
    setting.equalization = True
    setting.equalization_setting.iterations = 2
    setting.quantize_activation_setting.calib_algorithm = "percentile"
    images = np.load(os.path.join(os.path.dirname(DEMO), "digits.npz"))["images"][:32]
    batches = [(images[i:i + 16, None].astype(np.float32) / 16 - 0.5) for i in (0, 16)]
    graph = ppqlike.quantize_onnx_model(DEMO, batches, platform="TRT_INT8", setting=setting)
    recorded = graph.metadata["quantization"]["setting"]
    assert (recorded["equalization"], recorded["equalization_iterations"], recorded["activation_observer"]) == \
        (True, 2, "percentile")
    assert any(p["name"] == "equalization" for p in graph.metadata["quantization"]["passes"])
