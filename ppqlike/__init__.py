"""ppqlike: post-training quantization of ONNX models, in the pass-pipeline style of PPQ.

The package root resolves its public names lazily (PEP 562), so that importing
a low layer (``import ppqlike.core.quant``) loads nothing above it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC_NAMES = {
    "PPQLikeError": "ppqlike.core.errors",
    "Graph": "ppqlike.core.ir", "Operation": "ppqlike.core.ir", "Variable": "ppqlike.core.ir",
    "NumpyExecutor": "ppqlike.executor", "OperationHook": "ppqlike.executor",
    "load_onnx_graph": "ppqlike.io", "export_onnx_model": "ppqlike.io", "save_onnx_graph": "ppqlike.io",
    "quantize_onnx_model": "ppqlike.api", "export_ppq_graph": "ppqlike.api",
    "import_quantized_onnx": "ppqlike.api",
    "QuantizationSetting": "ppqlike.optim.setting", "QuantizationSettingFactory": "ppqlike.optim.setting",
    "TargetPlatform": "ppqlike.platforms.target", "dispatch_graph": "ppqlike.api",
    "register_pass": "ppqlike.optim.base", "QuantizationOptimizationPass": "ppqlike.optim.base",
    "graphwise_error_analyse": "ppqlike.analysis", "layerwise_error_analyse": "ppqlike.analysis",
    "compare_stages": "ppqlike.analysis",
    # PPQ's names (``from ppq import *``), over the above: see docs/MIGRATING_FROM_PPQ.md
    "BaseGraph": "ppqlike.ppq_names", "TorchExecutor": "ppqlike.ppq_names", "ENABLE_CUDA_KERNEL": "ppqlike.ppq_names",
    "PPQ_CONFIG": "ppqlike.ppq_names", "ppq_warning": "ppqlike.ppq_names",
    "convert_any_to_numpy": "ppqlike.ppq_names",
    "TensorQuantizationConfig": "ppqlike.core.quant", "OperationQuantizationConfig": "ppqlike.core.quant_operation",
    "QuantizationStates": "ppqlike.core.quant", "QuantizationPolicy": "ppqlike.core.quant",
    "QuantizationProperty": "ppqlike.core.quant", "RoundingPolicy": "ppqlike.core.quant",
    "QuantizationOptimizationPipeline": "ppqlike.optim.base",
    **{name: "ppqlike.quantization.optim" for name in (
        "QuantizeRefinePass", "QuantizeSimplifyPass", "QuantizeFusionPass", "ParameterQuantizePass",
        "RuntimeCalibrationPass", "PassiveParameterQuantizePass", "QuantAlignmentPass", "ParameterBakingPass",
        "LayerwiseEqualizationPass", "BiasCorrectionPass", "AdaRoundPass")},
}
_SUBPACKAGES = frozenset({"core", "io", "executor", "platforms", "optim", "export", "analysis", "cli", "api",
                          "lib", "quantization"})

__all__ = sorted(_PUBLIC_NAMES) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_NAMES:
        value = getattr(importlib.import_module(_PUBLIC_NAMES[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"ppqlike.{name}")
    else:
        raise AttributeError(f"module 'ppqlike' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC_NAMES) | _SUBPACKAGES)
