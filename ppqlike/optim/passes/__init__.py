"""The core passes and the optional accuracy passes, one module each."""

from .adaround import AdaroundPass
from .alignment import QuantizationAlignmentPass
from .baking import ParameterBakingPass
from .bias_correction import BiasCorrectionPass
from .bias_range import Int32BiasRangePass
from .bodies import BodyQuantizationPass
from .calibration import RuntimeCalibrationPass
from .equalization import LayerwiseEqualizationPass
from .fusion import FusionPass
from .mixed_precision import MixedPrecisionPass
from .parameter import ParameterQuantizePass
from .passive import PassiveParameterQuantizePass
from .placement import QuantizationPlacementPass
from .protection import LayerProtectionPass
from .range_search import ActivationRangeSearchPass
from .reconstruction import SequentialReconstructionPass
from .block_reconstruction import BlockReconstructionPass
from .refine import QuantizeRefinePass
from .requantization import IntegerRequantizationPass
from .runtime_kernels import RuntimeKernelPass
from .simplify import QuantizationSimplifyPass
from .smooth_quant import SmoothQuantPass
from .awq import AWQPass
from .gptq import GPTQPass
from .weight_only import WeightOnlyQuantizePass

__all__ = ["QuantizeRefinePass", "FusionPass", "QuantizationSimplifyPass", "ParameterQuantizePass", "RuntimeCalibrationPass",
           "QuantizationAlignmentPass", "PassiveParameterQuantizePass", "ParameterBakingPass", "IntegerRequantizationPass",
           "LayerwiseEqualizationPass", "BiasCorrectionPass", "AdaroundPass", "MixedPrecisionPass",
           "RuntimeKernelPass", "SmoothQuantPass", "ActivationRangeSearchPass", "Int32BiasRangePass",
           "QuantizationPlacementPass", "LayerProtectionPass", "BodyQuantizationPass",
           "AWQPass", "GPTQPass", "WeightOnlyQuantizePass", "SequentialReconstructionPass",
           "BlockReconstructionPass"]
