"""The core passes, one module each, in pipeline order."""

from .alignment import QuantizationAlignmentPass
from .baking import ParameterBakingPass
from .calibration import RuntimeCalibrationPass
from .fusion import FusionPass
from .parameter import ParameterQuantizePass
from .passive import PassiveParameterQuantizePass
from .requantization import IntegerRequantizationPass
from .simplify import QuantizationSimplifyPass

__all__ = ["FusionPass", "QuantizationSimplifyPass", "ParameterQuantizePass", "RuntimeCalibrationPass",
           "QuantizationAlignmentPass", "PassiveParameterQuantizePass", "ParameterBakingPass", "IntegerRequantizationPass"]
