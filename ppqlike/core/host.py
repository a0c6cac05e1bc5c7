"""Facts about the machine ppqlike runs on that change what onnxruntime computes."""

from __future__ import annotations

import functools
import platform

import numpy as np

#: the largest |weight integer| for which onnxruntime's x86 u8 x s8 pair sums cannot saturate:
#: 2 * 255 * 64 < 2 ** 15
SATURATION_FREE_WEIGHT = 64


def weights_may_saturate(weight_integers) -> bool:
    """Whether 8-bit weight integers (zero point removed) leave the range onnxruntime's u8 x s8 pair sums
    keep exact on a CPU where :func:`onnxruntime_saturates_u8s8`."""
    weight_integers = np.asarray(weight_integers)
    return weight_integers.size > 1 and int(np.abs(weight_integers.astype(np.int64)).max()) > SATURATION_FREE_WEIGHT


@functools.lru_cache(maxsize=1)
def onnxruntime_saturates_u8s8() -> bool:
    """Whether this is an x86 CPU without VNNI, where onnxruntime's u8 x s8 integer kernels (QLinearConv,
    QLinearMatMul, and QDQ Conv/MatMul fused into them; int8 activations are shifted to uint8 first) add
    products in pairs with 16-bit saturation (vpmaddubsw), so int8 weights beyond 7 bits can give results
    other than the exact integer sum.  Its u8 x u8 kernels, and every kernel on ARM or with VNNI, are exact."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = info.read()
    except OSError:
        return False  # not Linux: unknown; assume a CPU with VNNI
    return "vnni" not in flags
