"""Layer 3: the numpy executor and its op kernels."""

from .executor import NumpyExecutor, OperationHook
from .ops import SUPPORTED_OP_TYPES

__all__ = ["NumpyExecutor", "OperationHook", "SUPPORTED_OP_TYPES"]
