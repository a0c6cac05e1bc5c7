"""Layer 5: the pass pipeline, the core passes and calibration observers."""

from .base import (DEFAULT_PASS_REGISTRY, PassRecord, PassRegistry, QuantizationOptimizationPass,
                   QuantizationOptimizationPipeline, iterate_calibration, register_pass)

__all__ = ["QuantizationOptimizationPass", "QuantizationOptimizationPipeline", "PassRecord", "PassRegistry",
           "DEFAULT_PASS_REGISTRY", "register_pass", "iterate_calibration"]
