"""Layer 2: ONNX import and export, graph formatting, static shapes and image preprocessing."""

from .format import (FormatReport, fold_batchnorm, fold_bias_add, fold_constants, fold_followers, fold_scale_mul,
                     format_graph, remove_dead_code, remove_identity)
from .files import MAX_IR_VERSION, atomic_write_bytes, read_json
from .images import load_image, load_image_folder
from .onnx_export import export_onnx_model, operation_to_node, save_onnx_graph
from .onnx_import import load_onnx_graph, read_model
from .shapes import infer_shapes, set_input_shapes

__all__ = ["load_onnx_graph", "read_model", "export_onnx_model", "save_onnx_graph", "atomic_write_bytes",
           "read_json", "MAX_IR_VERSION", "operation_to_node", "FormatReport", "format_graph", "fold_constants", "fold_batchnorm",
           "fold_bias_add", "fold_scale_mul", "fold_followers", "remove_identity", "remove_dead_code", "infer_shapes", "set_input_shapes",
           "load_image", "load_image_folder"]
