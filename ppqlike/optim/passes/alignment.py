"""Alignment: inputs that must share a scale are made SLAVE of one master.

Reads: ACTIVATED configs after calibration.
Writes SLAVE:
* Concat: the config that quantizes each input tensor (the producer's output
  config at the end of its OVERLAPPED chain) becomes SLAVE of the Concat's
  output config, so the inputs already lie on the output's grid and the
  concatenation needs no requantization; where that config is not free (a
  graph input, a tensor read elsewhere, already a slave) the Concat's own
  input config becomes SLAVE instead and requantizes.
* Add/Sub, by setting: ``larger`` makes the input with the smaller range a
  SLAVE of the other, ``output`` makes both inputs SLAVE of the output,
  ``none`` leaves them.
"""

from __future__ import annotations

from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import (configured_operations, input_config, master_root, output_config, producer_config,
                                 same_grid)
from ..base import QuantizationOptimizationPass

S = QuantizationStates


def _make_slave(config: TensorQuantizationConfig, master: TensorQuantizationConfig) -> bool:
    if config is master or master_root(config) is master or not same_grid(config, master):
        return False
    try:
        config.dominated_by(master, S.SLAVE)
    except Exception:  # a link that would close a cycle: leave this input requantizing
        return False
    return True


class QuantizationAlignmentPass(QuantizationOptimizationPass):
    """Make Concat (and, by setting, Add/Sub) inputs share one scale."""

    name = "alignment"

    def __init__(self, concat: bool = True, add: str = "none"):
        if add not in ("none", "larger", "output"):
            raise ValueError(f"add alignment must be 'none', 'larger' or 'output', not {add!r}")
        self.concat, self.add = concat, add

    def optimize(self, graph: Graph, **kwargs) -> dict:
        slaves = 0
        for operation in configured_operations(graph):
            master = output_config(operation)
            if master is None or master.state is not S.ACTIVATED:
                continue
            if operation.type == "Concat" and self.concat:
                slaves += self._align_concat(operation, master)
            elif operation.type in ("Add", "Sub") and self.add != "none":
                slaves += self._align_add(operation, master)
        return {"slaves": slaves}

    @staticmethod
    def _align_concat(operation: Operation, master: TensorQuantizationConfig) -> int:
        count = 0
        for index, variable in enumerate(operation.inputs):
            config = input_config(operation, index)
            if variable is None or config is None or variable.is_parameter:
                continue
            source = producer_config(variable)
            quantizer = master_root(source) if source is not None else None
            free = (quantizer is not None and quantizer.state is S.ACTIVATED
                    and all(c is operation for c in variable.consumers))
            if free and _make_slave(quantizer, master):
                count += 1
            elif config.state in (S.ACTIVATED, S.OVERLAPPED) and _make_slave(config, master):
                count += 1
        return count

    def _align_add(self, operation: Operation, output: TensorQuantizationConfig) -> int:
        configs = [input_config(operation, i) for i in range(len(operation.inputs))]
        if len(configs) != 2 or any(c is None for c in configs):
            return 0
        if self.add == "output":
            return sum(_make_slave(c, output) for c in configs)
        roots = [master_root(c) for c in configs]
        if any(r.scale is None or r.scale.ndim for r in roots):
            return 0
        larger = 0 if float(roots[0].scale) >= float(roots[1].scale) else 1
        return int(_make_slave(configs[1 - larger], roots[larger]))
