"""ppqlike: post-training quantization of ONNX models, in the pass-pipeline style of PPQ."""

__version__ = "0.1.0"

from .api import export_ppq_graph, quantize_onnx_model
from .core.errors import PPQLikeError
from .core.ir import Graph, Operation, Variable
from .executor import NumpyExecutor, OperationHook
from .io import export_onnx_model, load_onnx_graph, save_onnx_graph
from .optim.base import QuantizationOptimizationPass, register_pass
from .platforms.dispatch import dispatch_graph
from .platforms.target import TargetPlatform
from .setting import QuantizationSetting, QuantizationSettingFactory

__all__ = ["PPQLikeError", "Graph", "Operation", "Variable", "NumpyExecutor", "OperationHook",
           "load_onnx_graph", "export_onnx_model", "save_onnx_graph", "quantize_onnx_model", "export_ppq_graph",
           "QuantizationSetting", "QuantizationSettingFactory", "TargetPlatform", "dispatch_graph",
           "register_pass", "QuantizationOptimizationPass", "__version__"]
