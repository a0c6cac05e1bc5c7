"""QuantizationSetting: the user's knobs for one quantization run, saved to and loaded from JSON.

Assigning an attribute the setting does not define (``setting.smoothquant = True``) is refused, naming the
closest field (``ppqlike.core.declared_names``), as the JSON loader refuses unknown keys.  A setting says which
passes run and how; the platform's policy
(``ppqlike.platforms``) says what the hardware needs.  Where both speak (the
activation observer, Add alignment) a setting value other than None wins.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields

from ..core.declared_names import unknown_name_error
from ..core.errors import PlatformError
from ..io.files import atomic_write_bytes, read_json
from ..platforms.target import TargetPlatform
from .ppq_setting import DispatchingTable, PPQSettingViews

_OBSERVERS = ("minmax", "mean_minmax", "percentile", "kl", "entropy", "mse", "search", "auto")
_DISPATCHERS = ("conservative", "aggressive", "pointwise", "allin")
_EQUALIZATION_CLIP = ("exact", "skip")
_RECIPES = ("plain", "balanced", "best")  # what each does: ppqlike.optim.recipe_table.RECIPES (a test keeps them equal)
#: keys of settings saved by earlier versions -> today's field
_RENAMED = {"mixed_precision_target_cosine": "accuracy_target"}


def _is_kind(value, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, {"str": str, "dict": dict}[kind])


def _check_type(name: str, annotation: str, value) -> None:
    """PlatformError naming ``setting.name`` when ``value`` is not of the field's declared type."""
    kinds = [part.strip() for part in str(annotation).split("|")]
    if value is None and "None" in kinds:
        return
    wanted = [kind for kind in kinds if kind != "None"]
    if not any(_is_kind(value, kind) for kind in wanted):
        said = {"bool": "true or false", "int": "an integer", "float": "a finite number", "str": "a string",
                "dict": "an object"}
        description = " or ".join([said[kind] for kind in wanted] + (["null"] if "None" in kinds else []))
        raise PlatformError(f"setting.{name} must be {description}, got {value!r} ({type(value).__name__})")


_WEIGHT_ONLY_METHODS = ("rtn", "gptq", "awq")
_WEIGHT_ONLY_FORMATS = ("qdq", "matmulnbits")


def _check_weight_only(setting) -> None:
    """PlatformError naming the first bad weight-only field."""
    if setting.weight_only_bits not in (None, 4, 8):
        raise PlatformError(f"setting.weight_only_bits must be None, 4 or 8, got {setting.weight_only_bits!r}")
    size = setting.weight_only_block_size
    if size < 16 or size & (size - 1):
        raise PlatformError(f"setting.weight_only_block_size must be a power of 2, at least 16 (what "
                            f"MatMulNBits reads), got {size!r}")
    if setting.weight_only_method not in _WEIGHT_ONLY_METHODS:
        raise PlatformError(f"setting.weight_only_method {setting.weight_only_method!r} is unknown; choose one "
                            f"of {_WEIGHT_ONLY_METHODS}")
    if setting.weight_only_format not in _WEIGHT_ONLY_FORMATS:
        raise PlatformError(f"setting.weight_only_format {setting.weight_only_format!r} is unknown; choose one "
                            f"of {_WEIGHT_ONLY_FORMATS}")


@dataclass
class QuantizationSetting(PPQSettingViews):
    """Every option of a quantization run.  Defaults are what most users want.

    ``recipe``: 'balanced' (the default: activation ranges chosen by the quantization error they cause),
    'plain' (the platform's own calibration) or 'best' (balanced plus learned rounding of the weights and
    bias correction: minutes); see ppqlike.optim.recipe_table.RECIPES (a recipe fills what the other fields leave
    to it).  ``time_budget_s``: wall seconds of the whole quantize_onnx_model call that the optional work may
    fill (None: the recipe's own): learned rounding stops at 60% of it (layers not yet done keep nearest
    rounding), the range search at 85%, bias correction at 100%; see ppqlike.optim.recipe.build_pipeline.
    Formatting: ``fold_constants``, ``fold_batchnorm``, ``remove_identity``,
    ``fold_scale_mul`` (a constant per-channel Mul into the weights before it), ``fold_bias_add``, ``fold_pad``
    (zero Pads into Conv pads).  Dispatch:
    ``dispatcher`` and ``dispatching_table`` (op name -> 'TARGET' | 'FP32').  Passes: ``fusion``, ``simplify``,
    ``activation_observer`` (None: the platform's default), ``terminal_observer`` (the observer of
    tensors no quantized op reads: graph outputs and what only float ops read; None: the activation
    observer),
    ``weight_per_channel`` (None: the platform's), ``add_alignment`` (None:
    the platform's; 'none' | 'larger' | 'output'), ``concat_alignment``, ``recurrent`` (None: the
    platform's; 'float': LSTM/GRU/RNN run in float, 'quantize': their input and outputs quantized, float
    inside; see PlatformPolicy), ``placement`` (None: the platform's; 'every_output': every quantized op's
    outputs, 'compute_inputs': only what Conv/Gemm/MatMul read and residual skips, see
    ppqlike.optim.passes.placement),
    ``float_outputs`` (the ops that write the model's outputs run in float on their quantized inputs, as NNCF
    and ModelOpt leave outputs unquantized: no ties of close logits on an 8-bit grid, no small probabilities
    rounded to zero; where the placement quantizes every op's outputs; None: as the recipe says, on in
    balanced and best; see ppqlike.platforms.dispatch_outputs),
    ``search_batches`` (batches the TPU-style search evaluates on);
    ``calibration_backend`` 'local' or 'ray' with ``calibration_workers`` Ray workers (the
    batches sharded, the observers merged exactly: the same scales as 'local'; the threshold search's
    candidates, the accuracy target's measurements and learned rounding's layers split over the same
    workers, with the local run's results: see ``ppqlike.optim.distributed``).
    Accuracy passes, all off by default: ``equalization`` (cross-layer
    equalization before parameter quantization; ``equalization_iterations``
    sweeps, ``equalization_clip`` 'exact' | 'skip' says how pairs through
    a Clip are handled,
    ``equalization_max_scale`` bounds each channel's scale), ``bias_correction``
    (empirical per-channel bias correction on ``bias_correction_steps``
    calibration batches, None: all, and at most ``bias_correction_samples`` samples, None: no limit;
    ``bias_correction_scope`` 'weights': the mean error of the quantized
    weights on the quantized model's inputs, 'layer': of the weights and the op's own input grid on FP32
    inputs, as NNCF's fast bias correction), ``adaround`` (learned rounding of the
    weights: ``adaround_steps`` Adam iterations per layer on
    ``adaround_samples`` rows of the layer's input, after a search of the
    weight range), ``reconstruction`` (the weights' rounding learned again block after block (BRECQ), against
    the FP32 block output from the input the quantized network feeds each block, with QDrop's dropped
    quantization: ppqlike.optim.passes.block_reconstruction; ``reconstruction_samples`` calibration samples,
    ``reconstruction_steps`` Adam iterations per block, fewer where the time budget does not hold them;
    layers in no block (a transformer's MatMuls) as ppqlike.optim.passes.reconstruction, ``adaround_samples``
    rows each, their steps fitted likewise),
    ``smooth_quant`` (SmoothQuant: LayerNorm output outliers moved into the next weights;
    ``smooth_quant_alpha`` the migration strength, None: chosen per LayerNorm on the calibration data),
    ``range_search`` (each per-tensor activation range chosen again by the error it causes at its
    readers, with the quantized inputs they will see, on ``range_search_samples`` calibration samples),
    ``protection`` (the few layers whose 8-bit quantization alone wrecks the output, found on calibration
    data, move to the platform's higher precision: ppqlike.optim.passes.protection; None: as the recipe
    says, on in balanced and best; False: off with any recipe; ``protection_front_floor``: the held-aside output
    error, 1 - cosine, at or above which it moves a front of the graph, None: as the recipe says),
    ``accuracy_target`` (None: off; else the output cosine against FP32 to
    reach by moving the fewest ops to the platform's 16-bit grid, else FP32, measured on the last
    ``mixed_precision_batches`` calibration batches, held aside from calibration, at most
    ``mixed_precision_max_ops`` ops, None: no limit).
    ``keep_imported_scales``: an already quantized model (QDQ/QOperator) keeps the file's scales
    (quantize_onnx_model refuses it; False: recalibrate it from the calibration data).
    Export: ``export_uint8_activations``, ``export_qdq_per_consumer`` and ``export_uint8_weights``
    (int8 weights written as uint8 with zero point + 128, the same values: onnxruntime then runs its
    u8 x u8 kernels, exact on every CPU, where its u8 x s8 kernels saturate on x86 without VNNI;
    None: what the platform's exporter prefers, True for ORT_INT8).
    Weight-only quantization (W4A16 / W8A16, ``ppqlike.optim.passes.weight_only``): ``weight_only_bits``
    (None: off; 4 or 8: every MatMul/Gemm constant weight quantized in blocks of ``weight_only_block_size``
    along its input dimension, activations and every other op left float, on any platform),
    ``weight_only_symmetric`` (signed blocks, zero point 0; False: unsigned with a zero point per block),
    ``weight_only_method`` ('rtn' nearest rounding, 'gptq', 'awq') and ``weight_only_format`` ('qdq':
    opset-21 blocked DequantizeLinear; 'matmulnbits': com.microsoft MatMulNBits).
    """

    recipe: str = "balanced"
    time_budget_s: float | None = None
    fold_constants: bool = True
    fold_batchnorm: bool = True
    remove_identity: bool = True
    fold_bias_add: bool = True
    fold_scale_mul: bool = True
    fold_pad: bool = True
    dispatcher: str = "conservative"
    dispatching_table: dict = field(default_factory=DispatchingTable)
    fusion: bool = True
    simplify: bool = True
    activation_observer: str | None = None
    terminal_observer: str | None = None
    weight_per_channel: bool | None = None
    add_alignment: str | None = None
    concat_alignment: bool = True
    recurrent: str | None = None
    placement: str | None = None
    float_outputs: bool | None = None
    search_batches: int = 1
    calibration_backend: str = "local"
    calibration_workers: int = 2
    equalization: bool = False
    equalization_iterations: int = 10
    equalization_clip: str = "exact"
    equalization_max_scale: float = 16.0
    bias_correction: bool = False
    bias_correction_steps: int | None = None
    bias_correction_samples: int | None = None
    bias_correction_scope: str = "weights"
    adaround: bool = False
    adaround_steps: int = 500
    adaround_samples: int = 4096
    reconstruction: bool = False
    reconstruction_samples: int = 32
    reconstruction_steps: int = 1000
    smooth_quant: bool = False
    smooth_quant_alpha: float | None = None
    range_search: bool = False
    range_search_samples: int = 32
    protection: bool | None = None
    protection_front_floor: float | None = None
    accuracy_target: float | None = None
    mixed_precision_batches: int = 2
    mixed_precision_max_ops: int | None = None
    keep_imported_scales: bool = True
    export_uint8_activations: bool | None = None
    export_qdq_per_consumer: bool | None = None
    export_uint8_weights: bool | None = None
    weight_only_bits: int | None = None
    weight_only_block_size: int = 32
    weight_only_symmetric: bool = True
    weight_only_method: str = "rtn"
    weight_only_format: str = "qdq"

    def __post_init__(self):
        self.validate()

    def validate(self) -> "QuantizationSetting":
        """Raise PlatformError naming the first bad value: every field has its declared type (booleans are
        booleans, not strings or numbers), then each field's range."""
        for item in fields(self):
            _check_type(item.name, item.type, getattr(self, item.name))
        if self.recipe not in _RECIPES:
            raise PlatformError(f"setting.recipe {self.recipe!r} is unknown; choose one of {_RECIPES}")
        if self.dispatcher not in _DISPATCHERS:
            raise PlatformError(f"setting.dispatcher {self.dispatcher!r} is unknown; choose one of {_DISPATCHERS}")
        for name in ("activation_observer", "terminal_observer"):
            if getattr(self, name) is not None and getattr(self, name) not in _OBSERVERS:
                raise PlatformError(f"setting.{name} {getattr(self, name)!r} is unknown; choose one of {_OBSERVERS}")
        if self.add_alignment not in (None, "none", "larger", "output"):
            raise PlatformError(f"setting.add_alignment {self.add_alignment!r} is unknown; "
                                "choose 'none', 'larger' or 'output'")
        if self.placement not in (None, "every_output", "compute_inputs"):
            raise PlatformError(f"setting.placement {self.placement!r} is unknown; choose 'every_output' or "
                                "'compute_inputs'")
        if self.recurrent not in (None, "float", "quantize"):
            raise PlatformError(f"setting.recurrent {self.recurrent!r} is unknown; choose 'float' or 'quantize'")
        if self.equalization_clip not in _EQUALIZATION_CLIP:
            raise PlatformError(f"setting.equalization_clip {self.equalization_clip!r} is unknown; "
                                f"choose one of {_EQUALIZATION_CLIP}")
        if self.bias_correction_scope not in ("weights", "layer"):
            raise PlatformError(f"setting.bias_correction_scope {self.bias_correction_scope!r} is unknown; choose "
                                "'weights' or 'layer'")
        if self.calibration_backend not in ("local", "ray"):
            raise PlatformError(f"setting.calibration_backend {self.calibration_backend!r} is unknown; choose "
                                "'local' or 'ray'")
        for name in ("search_batches", "calibration_workers", "equalization_iterations", "adaround_steps",
                     "adaround_samples", "mixed_precision_batches", "range_search_samples",
                     "reconstruction_samples", "reconstruction_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlatformError(f"setting.{name} must be a positive integer, got {value!r}")
        for name in ("bias_correction_steps", "bias_correction_samples", "mixed_precision_max_ops"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise PlatformError(f"setting.{name} must be None or a positive integer, got {value!r}")
        if not (isinstance(self.equalization_max_scale, (int, float)) and self.equalization_max_scale >= 1):
            raise PlatformError(f"setting.equalization_max_scale must be a number >= 1, "
                                f"got {self.equalization_max_scale!r}")
        alpha = self.smooth_quant_alpha
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1):
            raise PlatformError(f"setting.smooth_quant_alpha must be None or a number in [0, 1], got {alpha!r}")
        budget = self.time_budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
            raise PlatformError(f"setting.time_budget_s must be None or a number of seconds >= 0, got {budget!r}")
        front = self.protection_front_floor
        if front is not None and (isinstance(front, bool) or not isinstance(front, (int, float)) or not 0 < front < 1):
            raise PlatformError(f"setting.protection_front_floor must be None or an output error in (0, 1), "
                                f"got {front!r}")
        target = self.accuracy_target
        if target is not None and not (isinstance(target, (int, float)) and not isinstance(target, bool)
                                       and -1.0 < target <= 1.0):
            raise PlatformError(f"setting.accuracy_target must be None or a cosine in (-1, 1], "
                                f"got {target!r}")
        _check_weight_only(self)
        if not isinstance(self.dispatching_table, dict):
            raise PlatformError("setting.dispatching_table must map op names to 'TARGET' or 'FP32'")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "QuantizationSetting":
        data = {_RENAMED.get(key, key): value for key, value in data.items()}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise unknown_name_error(f"unknown setting keys {unknown}", unknown, known, noun="keys")
        return cls(**data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the setting as JSON (atomically)."""
        atomic_write_bytes(path, json.dumps(self.to_dict(), indent=2, sort_keys=True).encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "QuantizationSetting":
        """Read a setting written by :meth:`save` (or by hand)."""
        data = read_json(path, "setting file", PlatformError)
        if not isinstance(data, dict):
            raise PlatformError(f"setting file {os.fspath(path)!r} must hold a JSON object")
        return cls.from_dict(data)


class QuantizationSettingFactory:
    """Ready-made settings: a default and one preset per platform."""

    @staticmethod
    def default_setting() -> QuantizationSetting:
        return QuantizationSetting()

    @staticmethod
    def trt_setting() -> QuantizationSetting:
        """TensorRT: one Q/DQ pair per consumer so onnxruntime can fuse the int8 export (KL activations are the
        platform policy's own choice)."""
        return QuantizationSetting(export_qdq_per_consumer=True)

    @staticmethod
    def ort_setting() -> QuantizationSetting:
        """onnxruntime CPU: uint8 activations, min-max."""
        return QuantizationSetting(export_uint8_activations=True)

    @staticmethod
    def tpu_setting() -> QuantizationSetting:
        """TPU-MLIR (KL calibration is the platform policy's own choice)."""
        return QuantizationSetting()

    @staticmethod
    def dsp_setting() -> QuantizationSetting:
        return QuantizationSetting()

    @staticmethod
    def tidl_setting() -> QuantizationSetting:
        return QuantizationSetting(add_alignment="larger")

    @staticmethod
    def academic_setting() -> QuantizationSetting:
        return QuantizationSetting(dispatcher="aggressive")

    # PPQ's factory names, for the platforms its presets are made for
    @classmethod
    def pplcuda_setting(cls) -> QuantizationSetting:
        return cls.for_platform(TargetPlatform.PPL_CUDA_INT8)

    @classmethod
    def nxp_setting(cls) -> QuantizationSetting:
        return cls.for_platform(TargetPlatform.NXP_INT8)

    @classmethod
    def fpga_setting(cls) -> QuantizationSetting:
        return cls.for_platform(TargetPlatform.FPGA_INT8)

    @classmethod
    def ncnn_setting(cls) -> QuantizationSetting:
        return cls.for_platform(TargetPlatform.NCNN_INT8)

    @classmethod
    def for_platform(cls, platform, recipe: str | None = None) -> QuantizationSetting:
        """The preset of ``platform`` (the default where none is specific), with ``recipe`` when given."""
        platform = TargetPlatform.parse(platform)
        presets = {TargetPlatform.TRT_INT8: cls.trt_setting, TargetPlatform.PPL_CUDA_INT8: cls.trt_setting,
                   TargetPlatform.ORT_INT8: cls.ort_setting, TargetPlatform.TPU_INT8: cls.tpu_setting,
                   TargetPlatform.DSP_INT8: cls.dsp_setting, TargetPlatform.TIDL_INT8: cls.tidl_setting,
                   TargetPlatform.NXP_INT8: cls.tidl_setting, TargetPlatform.ACADEMIC_INT8: cls.academic_setting,
                   TargetPlatform.ACADEMIC_W4A8: cls.academic_setting}
        setting = presets.get(platform, cls.default_setting)()
        if recipe is not None:
            setting.recipe = recipe
            setting.validate()
        return setting
