"""ppqlike: post-training quantization of ONNX models, in the pass-pipeline style of PPQ."""

from .core.errors import PPQLikeError
from .core.ir import Graph, Operation, Variable
from .executor import NumpyExecutor, OperationHook
from .io import export_onnx_model, load_onnx_graph, save_onnx_graph

__version__ = "0.1.0"

__all__ = ["PPQLikeError", "Graph", "Operation", "Variable", "NumpyExecutor", "OperationHook",
           "load_onnx_graph", "export_onnx_model", "save_onnx_graph", "__version__"]
