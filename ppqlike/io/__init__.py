"""Layer 2: ONNX import and export, and graph formatting."""

from .onnx_export import atomic_write_bytes, export_onnx_model, save_onnx_graph
from .onnx_import import load_onnx_graph, read_model

__all__ = ["load_onnx_graph", "read_model", "export_onnx_model", "save_onnx_graph", "atomic_write_bytes"]
