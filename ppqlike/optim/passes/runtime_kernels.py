"""Mark the ops the deployment runtime computes with integer kernels (onnxruntime CPU).

Reads: the platform policy's ``runtime_kernels`` (given to the pass) and
the quantized ops of the graph.
Writes: ``runtime_kernel = 'onnxruntime'`` on the output config of
every quantized Conv, MatMul, Gemm, Add and GlobalAveragePool; no state
changes.  The executor then simulates those ops as onnxruntime's QLinearConv,
QLinearMatMul, QGemm, QLinearAdd and QLinearGlobalAveragePool compute them
(exact int32 accumulator, float32 requantization; see
``ppqlike.executor.onnxruntime_kernels``), so the simulation matches the
exported model run by onnxruntime bit for bit where onnxruntime fuses the
QDQ groups.  Ops whose inputs turn out not to be quantized at run time keep
their float kernel.
"""

from __future__ import annotations

from ...core.ir import Graph
from ...core.quant_graph import configured_operations, output_config
from ...executor.onnxruntime_kernels import RUNTIME_KERNEL, SUPPORTED_TYPES
from ..base import QuantizationOptimizationPass


class RuntimeKernelPass(QuantizationOptimizationPass):
    """Mark ops to be simulated as the deployment runtime's integer kernels."""

    name = "runtime_kernels"

    def __init__(self, runtime: str = RUNTIME_KERNEL):
        if runtime != RUNTIME_KERNEL:
            raise ValueError(f"runtime kernels {runtime!r} are not known; only {RUNTIME_KERNEL!r} is")
        self.runtime = runtime

    def optimize(self, graph: Graph, **kwargs) -> dict:
        marked = 0
        for operation in configured_operations(graph):
            config = output_config(operation)
            if operation.type in SUPPORTED_TYPES and config is not None:
                config.runtime_kernel = self.runtime
                marked += 1
        return {"runtime_kernel": self.runtime, "marked_ops": marked}
