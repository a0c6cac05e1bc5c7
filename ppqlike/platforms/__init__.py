"""Layer 4: target platforms, the dispatcher and (in sibling modules) the platform quantizers."""

from .dispatch import DISPATCHERS, PASSTHROUGH_TYPES, dispatch_graph, quantization_boundaries
from .dispatch_soi import SOI_GENERATORS, SOI_INPUTS, soi_input_indices, soi_operations
from .target import QUANTIZED_PLATFORMS, TargetPlatform, is_quantized_platform

__all__ = ["TargetPlatform", "QUANTIZED_PLATFORMS", "is_quantized_platform",
           "dispatch_graph", "quantization_boundaries", "DISPATCHERS", "PASSTHROUGH_TYPES",
           "SOI_INPUTS", "SOI_GENERATORS", "soi_input_indices", "soi_operations"]
