"""The table of platform policies, and the quantizer of a platform."""

from __future__ import annotations

from types import MappingProxyType

from ..core.errors import PlatformError
from .academic import ACADEMIC_INT4_POLICY, ACADEMIC_INT8_POLICY, ACADEMIC_MIX_POLICY, ACADEMIC_W4A8_POLICY
from .dsp import DSP_INT8_POLICY
from .floating import BF16_POLICY, FP8_POLICY, FP16_POLICY, GRAPHCORE_FP8_POLICY, TRT_FP8_POLICY
from .onnxruntime import ORT_INT8_POLICY
from .power_of_two import NXP_INT8_POLICY, TIDL_INT8_POLICY
from .quantizer import PlatformPolicy, PlatformQuantizer
from .target import TargetPlatform
from .tensorrt import PPL_CUDA_INT4_POLICY, PPL_CUDA_INT8_POLICY, PPL_CUDA_MIX_POLICY, TRT_INT8_POLICY
from .tpu import TPU_BF16_POLICY, TPU_F16_POLICY, TPU_INT8_POLICY

PLATFORM_POLICIES = MappingProxyType({policy.platform: policy for policy in (
    TRT_INT8_POLICY, PPL_CUDA_INT8_POLICY, ORT_INT8_POLICY, TPU_INT8_POLICY, TIDL_INT8_POLICY,
    NXP_INT8_POLICY, DSP_INT8_POLICY, ACADEMIC_INT8_POLICY, ACADEMIC_W4A8_POLICY,
    TRT_FP8_POLICY, GRAPHCORE_FP8_POLICY, FP8_POLICY, FP16_POLICY, BF16_POLICY, TPU_BF16_POLICY, TPU_F16_POLICY,
    ACADEMIC_INT4_POLICY, ACADEMIC_MIX_POLICY, PPL_CUDA_INT4_POLICY, PPL_CUDA_MIX_POLICY)})


def get_platform_policy(platform) -> PlatformPolicy:
    """The policy of ``platform`` (a TargetPlatform or its name, any case)."""
    platform = TargetPlatform.parse(platform)
    policy = PLATFORM_POLICIES.get(platform)
    if policy is None:
        valid = ", ".join(p.name for p in PLATFORM_POLICIES)
        raise PlatformError(f"{platform.name} is not a quantization target; choose one of {valid}")
    return policy


def get_quantizer(platform) -> PlatformQuantizer:
    """A quantizer for ``platform`` (a TargetPlatform, its name, or a PlatformPolicy)."""
    policy = platform if isinstance(platform, PlatformPolicy) else get_platform_policy(platform)
    return PlatformQuantizer(policy)
