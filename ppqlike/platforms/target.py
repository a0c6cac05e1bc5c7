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
    TPU_BF16 = "TPU_BF16"            # TPU-MLIR's BF16 mode (every op bfloat16)
    TPU_F16 = "TPU_F16"              # TPU-MLIR's F16 mode (every op half)
    TIDL_INT8 = "TIDL_INT8"          # TI TIDL, power-of-2 scales
    NXP_INT8 = "NXP_INT8"            # NXP, power-of-2 scales
    DSP_INT8 = "DSP_INT8"            # generic DSP, asymmetric per tensor
    PPL_CUDA_INT8 = "PPL_CUDA_INT8"  # OpenPPL CUDA
    ACADEMIC_INT8 = "ACADEMIC_INT8"  # every quantizable op, plain min-max
    ACADEMIC_W4A8 = "ACADEMIC_W4A8"  # 4-bit weights, 8-bit activations
    TRT_FP8 = "TRT_FP8"              # TensorRT FP8 (E4M3)
    GRAPHCORE_FP8 = "GRAPHCORE_FP8"  # Graphcore IPU FP8 (E4M3, power-of-2 scales)
    FP8 = "FP8"                      # academic FP8 E4M3
    FP16 = "FP16"                    # academic: every quantizable op cast to half
    BF16 = "BF16"                    # academic: every quantizable op cast to bfloat16
    PPL_CUDA_INT4 = "PPL_CUDA_INT4"  # OpenPPL CUDA, int4 activations and weights
    PPL_CUDA_MIX = "PPL_CUDA_MIX"    # PPL CUDA int4, int8 as the higher precision
    ACADEMIC_INT4 = "ACADEMIC_INT4"  # every quantizable op, int4 activations and weights
    ACADEMIC_MIX = "ACADEMIC_MIX"    # academic int4, int8 as the higher precision
    FP32 = "FP32"                    # internal: runs in float (CPU fallback)
    SOI = "SOI"                      # internal: shape or index, never quantized
    UNSPECIFIED = "UNSPECIFIED"      # internal: not decided yet

    # PPQ's names for platforms whose policy one of the above is (aliases: the same member)
    ONNXRUNTIME = "ORT_INT8"         # PPQ's onnxruntime QDQ export
    OPENVINO_INT8 = "ORT_INT8"       # asymmetric per-tensor activations, symmetric per-channel weights
    RKNN_INT8 = "ORT_INT8"           # asymmetric per-tensor activations, symmetric per-channel weights
    NCNN_INT8 = "TRT_INT8"           # symmetric per-tensor activations, symmetric per-channel weights
    PPL_DSP_INT8 = "DSP_INT8"        # asymmetric per tensor
    SNPE_INT8 = "DSP_INT8"
    QNN_DSP_INT8 = "DSP_INT8"
    HEXAGON_INT8 = "DSP_INT8"
    PPL_DSP_TI_INT8 = "TIDL_INT8"    # power-of-2 scales
    FPGA_INT8 = "NXP_INT8"           # power-of-2 symmetric per tensor

    # PPQ's platforms ppqlike has no policy for: they exist (so PPQ scripts that name them load) and using
    # one raises a PlatformError naming the closest supported platform (see PPQ_UNSUPPORTED)
    PPL_CUDA_FP16 = "PPQ:PPL_CUDA_FP16"
    TENGINE_INT8 = "PPQ:TENGINE_INT8"
    MNN_INT8 = "PPQ:MNN_INT8"
    METAX_INT8_C = "PPQ:METAX_INT8_C"
    METAX_INT8_T = "PPQ:METAX_INT8_T"
    HOST_INT8 = "PPQ:HOST_INT8"

    @classmethod
    def parse(cls, value: "TargetPlatform | str") -> "TargetPlatform":
        """The member for ``value``: a member, or its name in any case ("trt_int8", "TRT-INT8").

        Raises PlatformError listing the valid names for anything else.
        """
        if isinstance(value, cls):
            return value.check_supported()
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            if key in cls.__members__:
                return cls[key].check_supported()
        valid = ", ".join(member.name for member in QUANTIZED_PLATFORMS)
        raise PlatformError(f"unknown target platform {value!r}; valid names are: {valid}")

    @property
    def is_quantized(self) -> bool:
        """True for the quantized back ends, False for FP32, SOI, UNSPECIFIED and PPQ's unsupported names."""
        return self not in _INTERNAL and self not in PPQ_UNSUPPORTED

    def check_supported(self) -> "TargetPlatform":
        """The member itself, or PlatformError for a PPQ platform ppqlike has no policy for."""
        if self in PPQ_UNSUPPORTED:
            closest, why = PPQ_UNSUPPORTED[self]
            raise PlatformError(f"{self.name} is a PPQ platform ppqlike does not implement ({why}); the closest "
                                f"ppqlike platform is {closest.name}")
        return self


_INTERNAL = frozenset({TargetPlatform.FP32, TargetPlatform.SOI, TargetPlatform.UNSPECIFIED})

_T = TargetPlatform
#: PPQ platform -> (the closest ppqlike platform, why it is not the same)
PPQ_UNSUPPORTED = {
    _T.PPL_CUDA_FP16: (_T.PPL_CUDA_INT8, "half precision is not a quantization target here"),
    _T.TENGINE_INT8: (_T.TRT_INT8, "Tengine's export format is not written"),
    _T.MNN_INT8: (_T.TRT_INT8, "MNN's export format is not written"),
    _T.METAX_INT8_C: (_T.TRT_INT8, "MetaX's export format is not written"),
    _T.METAX_INT8_T: (_T.DSP_INT8, "MetaX's export format is not written"),
    _T.HOST_INT8: (_T.ACADEMIC_INT8, "PPQ's host quantizer is not reproduced"),
}

#: Every quantized platform ppqlike implements, in declaration order.
QUANTIZED_PLATFORMS = tuple(p for p in TargetPlatform if p.is_quantized)


def is_quantized_platform(platform: "TargetPlatform | str") -> bool:
    """True when ``platform`` (a member or its name) is a quantized back end, not FP32/SOI/UNSPECIFIED."""
    return TargetPlatform.parse(platform).is_quantized
