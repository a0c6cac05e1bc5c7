"""PPQ's nested setting objects as views on ppqlike's flat QuantizationSetting.

A PPQ script writes ``QS.equalization_setting.iterations = 3`` or
``QS.quantize_activation_setting.calib_algorithm = 'kl'``; each nested name
here is a :class:`SettingView` whose attributes read and write the flat
fields they mean (one place: :data:`NESTED`).  PPQ attributes with no
counterpart are accepted and noted once (they change nothing); any other name is
refused (``core.declared_names``: an UnknownSettingError naming the closest).
``QS.dispatching_table.append(operation, platform)`` pins an op in ppqlike's
{op name: 'TARGET' | 'FP32'} table.
"""

from __future__ import annotations

import functools

from ..core.compat import note_once
from ..core.declared_names import DeclaredAttributes
from ..core.errors import PlatformError, UnknownSettingError

#: PPQ's nested setting -> {its attribute: the flat QuantizationSetting field (None: accepted, no effect)}
NESTED = {
    "equalization_setting": {"iterations": "equalization_iterations", "value_threshold": None, "opt_level": None,
                             "interested_layers": None, "including_bias": None, "including_act": None},
    "quantize_activation_setting": {"calib_algorithm": "activation_observer"},
    "quantize_parameter_setting": {"calib_algorithm": None, "baking_parameter": None},
    "bias_correct_setting": {"steps": "bias_correction_steps", "block_size": None, "interested_layers": None,
                             "collecting_device": None},
    "lsq_optimization_setting": {"steps": "adaround_steps", "epochs": None, "lr": None, "collecting_device": None,
                                 "is_scale_trainable": None, "block_size": None, "gamma": None},
    "advanced_optimization_setting": {"steps": "adaround_steps", "lr": None, "collecting_device": None,
                                      "auto_check": None, "block_size": None},
    "fusion_setting": {"align_quantization": "concat_alignment", "refine_quantization": None,
                       "fuse_activation": "fusion", "remove_useless_quantization": "simplify",
                       "fuse_conv_add": None, "fuse_passive_op": None},
    "dispatching_setting": {},
}

#: PPQ's switches whose algorithm ppqlike replaces with its closest one -> (the flat field, what runs)
SWITCHES = {
    "bias_correct": ("bias_correction", "empirical bias correction"),
    "lsq_optimization": ("adaround", "ppqlike has no LSQ training; AdaRound (learned weight rounding) runs instead"),
    "advanced_optimization": ("adaround", "ppqlike has no block-wise training; AdaRound runs instead"),
}

#: PPQ's calib_algorithm names -> ppqlike's observers
_OBSERVER_NAMES = {"minmax": "minmax", "kl": "kl", "percentile": "percentile", "mse": "mse", "entropy": "kl",
                   "isotone": None, "floating": None}


class SettingView(DeclaredAttributes):
    """One of PPQ's nested setting objects, reading and writing the flat setting (see :data:`NESTED`)."""

    _attribute_hint = " (see docs/MIGRATING_FROM_PPQ.md)"

    def __init__(self, setting, name: str):
        object.__setattr__(self, "_setting", setting)
        object.__setattr__(self, "_name", name)

    def _declared_attributes(self):
        return NESTED[self._name]

    def _attribute_owner(self) -> str:
        return f"QuantizationSetting.{self._name}"

    def _field(self, attribute: str) -> str | None:
        self._check_declared(attribute)
        return NESTED[self._name][attribute]

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        field = self._field(attribute)
        return None if field is None else getattr(self._setting, field)

    def __setattr__(self, attribute: str, value) -> None:
        if attribute.startswith("_"):
            object.__setattr__(self, attribute, value)
            return
        field = self._field(attribute)
        if field is None:
            note_once(f"QuantizationSetting.{self._name}.{attribute} has no counterpart in ppqlike; it is ignored")
            return
        if field == "activation_observer":
            value = observer_name(value)
        self._setting.__setattr__(field, value)
        self._setting.validate()

    def __repr__(self) -> str:
        shown = {a: getattr(self, a) for a, f in NESTED[self._name].items() if f is not None}
        return f"{self._name}({shown})"


def observer_name(name):
    """ppqlike's observer for PPQ's ``calib_algorithm`` name (None stays None); PlatformError when unknown."""
    if name is None:
        return None
    key = str(name).lower()
    if key not in _OBSERVER_NAMES or _OBSERVER_NAMES[key] is None:
        known = sorted(k for k, v in _OBSERVER_NAMES.items() if v)
        raise PlatformError(f"calib_algorithm {name!r} is not available in ppqlike; choose one of {known}")
    return _OBSERVER_NAMES[key]


class DispatchingTable(DeclaredAttributes, dict):
    """{op name: 'TARGET' | 'FP32'}, with PPQ's ``append(operation, platform)``; it has no attributes to set."""

    _attribute_hint = (" (a dispatching table is a dict: pin an op with table[op_name] = 'FP32' or "
                       "table.append(operation, platform))")

    def append(self, operation, platform) -> None:
        """Pin ``operation`` (an op or its name) to ``platform``: FP32 (or SOI) keeps it in float, any
        quantized platform (or UNSPECIFIED) sends it to the target."""
        name = getattr(operation, "name", operation)
        label = getattr(platform, "name", str(platform)).upper()
        self[str(name)] = "FP32" if label in ("FP32", "SOI") else "TARGET"


#: PPQ's switches that are always on in ppqlike (reading gives True; setting False is noted)
_ALWAYS_ON = ("quantize_activation", "quantize_parameter")


@functools.lru_cache(maxsize=None)
def _setting_names(setting_class: type) -> frozenset[str]:
    """The attributes a QuantizationSetting may be assigned: its dataclass fields and PPQ's switches."""
    return frozenset(setting_class.__dataclass_fields__) | frozenset(SWITCHES) | frozenset(_ALWAYS_ON)


class PPQSettingViews(DeclaredAttributes):
    """Mixin of QuantizationSetting: PPQ's nested names and switches (see the module docstring); any other
    attribute is refused, naming the closest field."""

    def _declared_attributes(self):
        return _setting_names(type(self))

    def __getattr__(self, name: str):
        if name in NESTED:
            return SettingView(self, name)
        if name in SWITCHES:
            return getattr(self, SWITCHES[name][0])
        if name in _ALWAYS_ON:
            return True
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise self._unknown_attribute(name)

    def __setattr__(self, name: str, value) -> None:
        if name in NESTED:
            raise UnknownSettingError(f"QuantizationSetting.{name} is PPQ's nested setting, a view on the flat "
                                      f"fields; set its attributes one by one (its attributes are "
                                      f"{sorted(NESTED[name])}) instead of replacing it")
        self._check_declared(name)
        if name in SWITCHES:
            field, what = SWITCHES[name]
            if value:
                note_once(f"QuantizationSetting.{name}: {what}")
            name = field
        elif name in _ALWAYS_ON:
            if not value:
                note_once(f"QuantizationSetting.{name} = False is ignored: ppqlike quantizes what the platform "
                          "quantizes (pin ops to FP32 with dispatching_table instead)")
            return
        elif name == "dispatching_table" and isinstance(value, dict) and not isinstance(value, DispatchingTable):
            value = DispatchingTable(value)
        object.__setattr__(self, name, value)
