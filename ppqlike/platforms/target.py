"""Target platforms: where an operation runs and how it is quantized.

:class:`TargetPlatform` names the quantized back ends (TensorRT, onnxruntime,
TPU-MLIR, TIDL, NXP, DSP, PPL-CUDA, academic) and three internal labels the
dispatcher writes on ``Operation.platform``: FP32 (runs in float on purpose),
SOI (shape or index: never quantized) and UNSPECIFIED.  Pure data: reads and
writes no graph state.
"""

from __future__ import annotations

from enum import Enum

from ..core.errors import PlatformError


class TargetPlatform(Enum):
    """A quantization target, or one of the internal labels FP32, SOI and UNSPECIFIED."""

    TRT_INT8 = "TRT_INT8"            # NVIDIA TensorRT
    ORT_INT8 = "ORT_INT8"            # onnxruntime (QDQ)
    TPU_INT8 = "TPU_INT8"            # TPU-MLIR style integer-only
    TIDL_INT8 = "TIDL_INT8"          # TI TIDL, power-of-2 scales
    NXP_INT8 = "NXP_INT8"            # NXP, power-of-2 scales
    DSP_INT8 = "DSP_INT8"            # generic DSP, asymmetric per tensor
    PPL_CUDA_INT8 = "PPL_CUDA_INT8"  # OpenPPL CUDA
    ACADEMIC_INT8 = "ACADEMIC_INT8"  # every quantizable op, plain min-max
    ACADEMIC_W4A8 = "ACADEMIC_W4A8"  # 4-bit weights, 8-bit activations
    FP32 = "FP32"                    # internal: runs in float (CPU fallback)
    SOI = "SOI"                      # internal: shape or index, never quantized
    UNSPECIFIED = "UNSPECIFIED"      # internal: not decided yet

    @classmethod
    def parse(cls, value: "TargetPlatform | str") -> "TargetPlatform":
        """The member for ``value``: a member, or its name in any case ("trt_int8", "TRT-INT8").

        Raises PlatformError listing the valid names for anything else.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            if key in cls.__members__:
                return cls[key]
        valid = ", ".join(name for name, member in cls.__members__.items() if member not in _INTERNAL)
        raise PlatformError(f"unknown target platform {value!r}; valid names are: {valid}")

    @property
    def is_quantized(self) -> bool:
        """True for the quantized back ends, False for FP32, SOI and UNSPECIFIED."""
        return self not in _INTERNAL


_INTERNAL = frozenset({TargetPlatform.FP32, TargetPlatform.SOI, TargetPlatform.UNSPECIFIED})

#: Every quantized platform, in declaration order.
QUANTIZED_PLATFORMS = tuple(p for p in TargetPlatform if p not in _INTERNAL)


def is_quantized_platform(platform: "TargetPlatform | str") -> bool:
    """True when ``platform`` (a member or its name) is a quantized back end, not FP32/SOI/UNSPECIFIED."""
    return TargetPlatform.parse(platform).is_quantized
