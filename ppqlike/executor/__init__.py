"""Layer 3: the numpy executor and its op kernels."""

from .executor import NumpyExecutor, OperationHook
from .ops import SUPPORTED_OP_TYPES
from .ops._threads import computing_threads, num_threads, set_num_threads

__all__ = ["NumpyExecutor", "OperationHook", "SUPPORTED_OP_TYPES", "computing_threads", "num_threads",
           "set_num_threads"]
