"""PPQ's pass classes by name, over ppqlike's passes (``from ppqlike.quantization.optim import ...``).

Each PPQ name is ppqlike's pass of that job, taking PPQ's constructor
keywords: those with a ppqlike meaning are used, PPQ's others
(``accepted_keywords``) accepted and noted once, any other refused (an
UnknownKeywordError naming the closest).  Passes PPQ has and ppqlike lacks
raise a PlatformError naming the closest one.  Use them in ``ppqlike.lib.Pipeline`` as in PPQ.
"""

from __future__ import annotations

from ..core.compat import note_once
from ..core.errors import PlatformError
from ..optim.base import QuantizationOptimizationPass, QuantizationOptimizationPipeline
from ..optim.passes.adaround import AdaroundPass
from ..optim.passes.alignment import QuantizationAlignmentPass
from ..optim.passes.baking import ParameterBakingPass
from ..optim.passes.bias_correction import BiasCorrectionPass
from ..optim.passes.calibration import RuntimeCalibrationPass as _Calibration
from ..optim.passes.equalization import LayerwiseEqualizationPass as _Equalization
from ..optim.passes.fusion import FusionPass
from ..optim.passes.parameter import ParameterQuantizePass
from ..optim.passes.passive import PassiveParameterQuantizePass as _Passive
from ..optim.passes.refine import QuantizeRefinePass as _Refine
from ..optim.passes.simplify import QuantizationSimplifyPass
from ..platforms.policies import get_platform_policy

#: PPQ's alignment words -> ppqlike's ``add`` alignment
_ALIGNMENT = {"align to large": "larger", "align to output": "output", "none": "none", None: "none"}


def _ignored(pass_name: str, options: dict) -> None:
    for key in sorted(options):
        note_once(f"{pass_name}({key}=...) has no counterpart in ppqlike; it is ignored")


class QuantizeRefinePass(_Refine):
    """PPQ's QuantizeRefinePass: the policy is the quantized ops' platform's when not given."""

    accepted_keywords = ()

    def __init__(self, policy=None, **options):
        _ignored("QuantizeRefinePass", options)
        self.policy = policy
        if policy is not None:
            super().__init__(policy)

    def optimize(self, graph, **kwargs):
        if self.policy is None:
            platforms = {op.platform for op in graph.operations.values()
                         if op.config is not None and op.platform is not None and op.platform.is_quantized}
            if len(platforms) != 1:
                raise PlatformError(f"QuantizeRefinePass() needs the platform's policy: graph {graph.name!r} has "
                                    f"quantized ops of {sorted(p.name for p in platforms) or 'no'} platform(s); "
                                    "pass QuantizeRefinePass(get_platform_policy(platform))")
            super().__init__(get_platform_policy(platforms.pop()))
        return super().optimize(graph, **kwargs)


class QuantizeSimplifyPass(QuantizationSimplifyPass):
    """PPQ's QuantizeSimplifyPass (ppqlike's simplify)."""

    accepted_keywords = ()

    def __init__(self, **options):
        _ignored("QuantizeSimplifyPass", options)
        super().__init__()


class QuantizeFusionPass(FusionPass):
    """PPQ's QuantizeFusionPass: ``activation_type`` is the set of activation types fused into their producer."""

    accepted_keywords = ("fuse_passive_op", "fuse_relu_clip")

    def __init__(self, activation_type=None, fuse_activation: bool = True, **options):
        _ignored("QuantizeFusionPass", options)
        super().__init__(activation_types=frozenset(activation_type or ()) if fuse_activation else frozenset())


class RuntimeCalibrationPass(_Calibration):
    """PPQ's RuntimeCalibrationPass: ``method`` sets the observer of every activation still to calibrate."""

    accepted_keywords = ("calib_steps",)

    def __init__(self, method: str | None = None, override: bool = False, calib_block_size: int = 16, **options):
        _ignored("RuntimeCalibrationPass", options)
        super().__init__()
        self.method = method

    def optimize(self, graph, **kwargs):
        if self.method is not None:
            from ..core.quant import QuantizationStates
            from ..optim.ppq_setting import observer_name
            observer = observer_name(self.method)
            for operation in graph.operations.values():
                for config in operation.config.all_configs() if operation.config is not None else ():
                    if config.state is QuantizationStates.INITIAL and config.observer_algorithm != observer \
                            and config.num_of_bits <= 16:
                        config.observer_algorithm = observer
        return super().optimize(graph, **kwargs)


class PassiveParameterQuantizePass(_Passive):
    """PPQ's PassiveParameterQuantizePass (biases, Clip/Pad bounds follow their masters)."""

    accepted_keywords = ("clip_visiblity", "pad_visiblity")  # PPQ's spelling

    def __init__(self, process_clip: bool = True, process_bias: bool = True, process_pad: bool = True, **options):
        _ignored("PassiveParameterQuantizePass", options)
        super().__init__()


class QuantAlignmentPass(QuantizationAlignmentPass):
    """PPQ's QuantAlignmentPass: ``elementwise_alignment`` 'Align to Large' | 'Align to Output' | 'None'."""

    accepted_keywords = ("resize_alignment",)

    def __init__(self, elementwise_alignment: str | None = "Align to Output", concat_alignment: str | None = "Align "
                 "to Output", pooling_alignment=None, force_overlap: bool = False, **options):
        _ignored("QuantAlignmentPass", options)
        key = None if elementwise_alignment is None else str(elementwise_alignment).lower()
        if key not in _ALIGNMENT:
            raise PlatformError(f"QuantAlignmentPass(elementwise_alignment={elementwise_alignment!r}): choose "
                                "'Align to Large', 'Align to Output' or 'None'")
        super().__init__(concat=str(concat_alignment).lower() != "none", add=_ALIGNMENT[key])


class LayerwiseEqualizationPass(_Equalization):
    """PPQ's LayerwiseEqualizationPass: ``iterations`` rounds of cross-layer equalization."""

    accepted_keywords = ("value_threshold", "including_weight", "weight_multiplier", "including_bias",
                         "including_act", "bias_multiplier", "act_multiplier", "interested_layers",
                         "optimize_level", "verbose")

    def __init__(self, iterations: int = 10, **options):
        _ignored("LayerwiseEqualizationPass", options)
        super().__init__(iterations=iterations)


class AdaRoundPass(AdaroundPass):
    """PPQ's AdaRoundPass (ppqlike's AdaroundPass): ``steps`` optimisation steps per layer."""

    accepted_keywords = ("name", "interested_layers", "is_scale_trainable", "lr", "gamma", "collecting_device",
                         "block_size")

    def __init__(self, steps: int = 500, **options):
        _ignored("AdaRoundPass", options)
        super().__init__(steps=steps)


class LearnedStepSizePass(QuantizationOptimizationPass):
    """PPQ's LSQ training: not in ppqlike (it would need gradients through the whole network)."""

    accepted_keywords = ("name", "interested_layers", "steps", "gamma", "is_scale_trainable", "lr", "block_size",
                         "expire_device", "collecting_device", "loss_fn", "optimizer")

    def __init__(self, *args, **kwargs):
        raise PlatformError("LearnedStepSizePass (LSQ training) is not implemented in ppqlike; the closest is "
                            "AdaRoundPass (learned rounding of the weights, layer by layer)")


__all__ = ["AdaRoundPass", "BiasCorrectionPass", "LayerwiseEqualizationPass", "LearnedStepSizePass",
           "ParameterBakingPass", "ParameterQuantizePass", "PassiveParameterQuantizePass", "QuantAlignmentPass",
           "QuantizationOptimizationPass", "QuantizationOptimizationPipeline", "QuantizeFusionPass",
           "QuantizeRefinePass", "QuantizeSimplifyPass", "RuntimeCalibrationPass"]
