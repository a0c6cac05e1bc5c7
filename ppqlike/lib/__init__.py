"""PPQ's foundation library (``import ppqlike.lib as PFL``): a pipeline composed by hand.

    quantizer = PFL.Quantizer(platform=TargetPlatform.TRT_INT8, graph=graph)
    dispatching = PFL.Dispatcher(graph=graph).dispatch(quant_types=quantizer.quant_operation_types)
    for op in graph.operations.values():
        quantizer.quantize_operation(op_name=op.name, platform=dispatching[op.name])
    pipeline = PFL.Pipeline([QuantizeFusionPass(activation_type=quantizer.activation_fusion_types),
                             ParameterQuantizePass(), RuntimeCalibrationPass(), PassiveParameterQuantizePass(),
                             ParameterBakingPass()])
    pipeline.optimize(graph=graph, dataloader=batches, executor=executor, calib_steps=8)
    PFL.Exporter(platform=TargetPlatform.TRT_INT8).export(file_path="model.int8.onnx", graph=graph)

Each is a thin layer over ppqlike's own pieces: the platform policy and quantizer (with the refine pass
applied per op, as PPQ's quantizers do), ``dispatch_graph``, the pass pipeline and ``export_for_platform``.
"""

from __future__ import annotations

from typing import Iterable

from ..core.compat import ignore_device, note_once
from ..core.declared_names import refuse_unknown_keywords
from ..core.errors import PlatformError
from ..core.ir import Graph
from ..export.platform import export_for_platform
from ..optim.base import QuantizationOptimizationPipeline
from ..optim.passes.refine import QuantizeRefinePass
from ..optim.ppq_setting import DispatchingTable
from ..platforms.dispatch import DISPATCHERS, dispatch_graph
from ..platforms.policies import get_platform_policy
from ..platforms.quantizer import PlatformQuantizer
from ..platforms.target import TargetPlatform

__all__ = ["Dispatcher", "Exporter", "Pipeline", "Quantizer"]

#: PPQ's keywords of ``dispatch`` that change nothing here
_PPQ_DISPATCH_KEYWORDS = ("quant_platform", "fp32_platform", "SOI_platform")


class Quantizer:
    """The quantizer of ``platform`` bound to ``graph`` (PPQ's ``PFL.Quantizer``)."""

    def __init__(self, platform, graph: Graph):
        self.platform = TargetPlatform.parse(platform)
        self.graph = graph
        self.policy = get_platform_policy(self.platform)
        self._quantizer = PlatformQuantizer(self.policy)
        self._refine = QuantizeRefinePass(self.policy)

    @property
    def quant_operation_types(self) -> set[str]:
        """The op types this platform quantizes."""
        return set(self.policy.quantizable_types)

    @property
    def activation_fusion_types(self) -> set[str]:
        """The activations this platform fuses into the op before them."""
        return set(self.policy.fused_activations)

    def quantize_operation(self, op_name: str, platform=None) -> None:
        """Write the op's configs: ``platform`` FP32/SOI keeps it in float; UNSPECIFIED quantizes it when its
        type is one this platform quantizes; the platform itself (or any quantized one) always quantizes it."""
        if op_name not in self.graph.operations:
            raise PlatformError(f"graph {self.graph.name!r} has no operation named {op_name!r}")
        operation = self.graph.operations[op_name]
        label = TargetPlatform.UNSPECIFIED if platform is None else TargetPlatform.parse(platform)
        quantize = label.is_quantized or (label is TargetPlatform.UNSPECIFIED
                                         and operation.type in self.policy.quantizable_types)
        if not quantize:
            operation.platform = TargetPlatform.FP32 if label is TargetPlatform.UNSPECIFIED else label
            operation.config = None
            return
        operation.platform = self.platform
        operation.config = self._quantizer.init_quantize_config(operation)
        self._refine.refine_operation(operation)


class Dispatcher:
    """PPQ's ``PFL.Dispatcher``: which ops go to the quantized region."""

    def __init__(self, graph: Graph, method: str = "conservative"):
        if str(method).strip().lower() not in DISPATCHERS:
            raise PlatformError(f"unknown dispatcher {method!r}; choose one of {', '.join(DISPATCHERS)}")
        self.graph, self.method = graph, method

    def dispatch(self, quant_types: Iterable[str], **options) -> DispatchingTable:
        """{op name: UNSPECIFIED (quantized region) | FP32 | SOI}, as PPQ's dispatcher returns it.  PPQ's
        ``quant_platform``, ``fp32_platform`` and ``SOI_platform`` are accepted and noted (the labels are
        these); any other keyword is refused."""
        refuse_unknown_keywords(Dispatcher.dispatch, options, "Dispatcher.dispatch()", _PPQ_DISPATCH_KEYWORDS)
        for key in sorted(options):
            note_once(f"Dispatcher.dispatch({key}=...) has no counterpart in ppqlike; it is ignored")
        # any quantized platform labels the region; the quantizer decides the platform afterwards
        dispatch_graph(self.graph, TargetPlatform.ACADEMIC_INT8, quant_types, dispatcher=self.method)
        table = DispatchingTable()
        for operation in self.graph.operations.values():
            label = operation.platform
            dict.__setitem__(table, operation.name, TargetPlatform.UNSPECIFIED if label.is_quantized else label)
            operation.platform = None if label.is_quantized else label
        return table


class Pipeline(QuantizationOptimizationPipeline):
    """PPQ's ``PFL.Pipeline``: ``optimize(graph, dataloader, executor, calib_steps, collate_fn, verbose)``."""

    def optimize(self, graph: Graph, dataloader=None, executor=None, calib_steps: int | None = None,
                 collate_fn=None, verbose: bool | int = False, **kwargs):
        if executor is None:
            from ..executor import NumpyExecutor
            executor = NumpyExecutor(graph)
        return super().optimize(graph, verbose=int(verbose), dataloader=dataloader, executor=executor,
                                calib_steps=calib_steps, collate_fn=collate_fn, **kwargs)


class Exporter:
    """PPQ's ``PFL.Exporter``: ``export(file_path, graph, config_path=None)`` for ``platform``."""

    def __init__(self, platform):
        self.platform = TargetPlatform.parse(platform)

    def export(self, file_path, graph: Graph, config_path=None, **options) -> list[str]:
        ignore_device(options.pop("device", None), "Exporter.export")
        return export_for_platform(graph, self.platform, file_path, config_path, stacklevel=3, **options)
