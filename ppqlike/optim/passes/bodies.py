"""Quantization of the ops inside the bodies of If, Loop and Scan.

The control-flow op itself is FP32 (the dispatcher says so): it runs in float, and the exported model
quantizes and dequantizes at its boundaries where a neighbour is quantized.  Its bodies' ops are
quantized like any op, each body as a model of its own: the values each body reads (its inputs and the
values it captures from the enclosing scope) are recorded while the enclosing graph runs on the
calibration data (``executor.ops.control_flow.observing_bodies``; a Loop body once per iteration, up
to ``max_samples`` runs per body, chosen evenly at random with a fixed seed), then the body is formatted,
dispatched, given configs by the platform quantizer and put through the same pass pipeline (which
quantizes the bodies nested in it the same way), with the recorded values as its calibration data.
A body that never ran on the calibration data (the If branch no batch took) stays in float, and the
report says so.  Reads the calibration data; writes the bodies' ops, configs and labels.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterable

import numpy as np

from ...core.ir import Graph
from ...core.subgraphs import captures, named_bodies
from ...executor.ops.control_flow import observing_bodies
from ..base import QuantizationOptimizationPass, iterate_calibration


@contextmanager
def body_as_model(body: Graph):
    """While in the block, ``body`` lists the values it captures after its inputs, as a model would, all of
    them of unstated shape (a body's declared input shapes are often not what runs: a Loop's iteration number
    declared [1] and given as a scalar, carried values that grow)."""
    original = list(body.inputs)
    shapes = [variable.shape for variable in original]
    body.inputs = original + captures(body)
    for variable in original:
        variable.shape = None
    try:
        yield body
    finally:
        body.inputs = original
        for variable, shape in zip(original, shapes):
            variable.shape = shape


def _copy(value):
    return [np.array(item) for item in value] if isinstance(value, list) else np.array(value)


class _Recorder:
    """Keeps up to ``limit`` of the value sets each watched body ran on (reservoir sampling, seeded)."""

    def __init__(self, bodies: list[Graph], limit: int):
        self.samples: dict[int, list] = {id(body): [] for body in bodies}
        self.seen: dict[int, int] = {id(body): 0 for body in bodies}
        self.limit = limit
        self.random = np.random.default_rng(0)

    def __call__(self, body, values: dict) -> None:
        key = id(body)
        if key not in self.samples:
            return   # a body nested deeper: its own body's pass records it
        self.seen[key] += 1
        kept = self.samples[key]
        if len(kept) < self.limit:
            kept.append({name: _copy(value) for name, value in values.items()})
            return
        slot = int(self.random.integers(self.seen[key]))
        if slot < self.limit:
            kept[slot] = {name: _copy(value) for name, value in values.items()}


class BodyQuantizationPass(QuantizationOptimizationPass):
    """Quantize the ops of every If/Loop/Scan body, each as a model calibrated on what it sees at run time."""

    name = "body quantization"

    def __init__(self, policy: Any, setting: Any, build_pipeline: Callable, format_graph: Callable,
                 max_samples: int = 64, verbose: bool = False):
        """``build_pipeline(policy, setting, bodies=...)`` and ``format_graph(graph, setting)``: the recipe's
        (``optim.recipe``, which builds this pass), applied to each body."""
        self.policy, self.setting = policy, setting
        self.build_pipeline, self.format_graph = build_pipeline, format_graph
        self.max_samples = int(max_samples)
        self.verbose = verbose

    def optimize(self, graph: Graph, executor: Any = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs: Any) -> dict:
        owners = [op for op in graph.topological_sort() if named_bodies(op)]
        if not owners:
            return {}
        bodies = [(op, key, body) for op in owners for key, body in named_bodies(op)]
        recorder = _Recorder([body for _, _, body in bodies], self.max_samples)
        with observing_bodies(recorder):
            for batch in iterate_calibration(dataloader, calib_steps, collate_fn, "body calibration", self.verbose):
                executor.forward(batch)
        report: dict = {}
        for operation, key, body in bodies:
            samples = recorder.samples[id(body)]
            where = f"{operation.name}.{key}"
            if not samples:
                report[where] = "never ran on the calibration data: left in float"
                continue
            report[where] = {"runs": recorder.seen[id(body)], "samples": len(samples),
                             **self.quantize_body(body, samples)}
        return {"bodies": report}


    def quantize_body(self, body: Graph, samples: list[dict]) -> dict:
        """Format, dispatch, configure and calibrate ``body`` as a model whose inputs are its own and the
        values it captures, on ``samples`` (dicts name -> value); returns what was done."""
        from ...executor import NumpyExecutor
        from ...platforms.dispatch import dispatch_graph
        from ...platforms.quantizer import PlatformQuantizer
        from ..setting import QuantizationSetting

        policy = self.policy
        setting = QuantizationSetting.from_dict({**self.setting.to_dict(), "accuracy_target": None})
        with body_as_model(body):
            self.format_graph(body, setting)
            summary = dispatch_graph(body, policy.platform, policy.quantizable_types, dispatcher=setting.dispatcher,
                                     transformer=policy.transformer, recurrent=policy.recurrent)
            PlatformQuantizer(policy).quantize(body)
            pipeline = self.build_pipeline(policy, setting, bodies=any(named_bodies(op) for op in body.operations.values()))
            records = pipeline.optimize(body, executor=NumpyExecutor(body), dataloader=samples,
                                        calib_steps=len(samples), collate_fn=None, held_aside=None)
        result = {"dispatch": summary.get("counts", {}), "passes": [r.name for r in records]}
        for record in records:
            if record.name == BodyQuantizationPass.name and record.report.get("bodies"):
                result["bodies"] = record.report["bodies"]
        return result


__all__ = ["BodyQuantizationPass", "body_as_model"]
