"""Accuracy target: move the fewest ops to a higher precision until the output cosine holds (TPU-MLIR style).

1. Units.  Fused ops move together (:func:`.precision_moves.find_units`).
Data: the batches ``quantize_onnx_model`` held aside from calibration (the last
``mixed_precision_batches`` of the calibration data, ``held_aside``); without
them (a dataloader of unknown length), the first ``batches`` calibration batches.

2. Sensitivity.  On those batches, each unit is quantized
   alone, everything else in float, and the cosine between the graph
   outputs and the FP32 outputs is measured (per sample, averaged; outputs
   averaged).  The FP32 intermediate values of the batch are computed once
   and only the ops downstream of the unit are run again, so a unit costs
   a partial forward pass.  The FP32 range of every tensor is noted on the
   way (a wider grid covers it).
The measure the target is held to is the mean per-sample output cosine minus
one standard error (:func:`cosine_lower_bound`): a few dozen samples estimate
the mean only to their spread, and a promise about unseen data should not
rest on the lucky side of it.

3. Greedy.  Starting from the quantized graph, units are moved worst first
   (lowest cosine when quantized alone), the whole quantized graph being
   measured again after every move, until the target cosine is reached (or
   ``max_ops`` ops are moved, or no candidate is left).  Where the platform
   has a wider integer grid (``higher_precision_bits``, 16 for onnxruntime,
   TIDL and DSPs) units move to it first; if every unit is there and the
   target still does not hold, units move on to FP32 in the same order.
   Platforms without one (TensorRT, TPU-MLIR, whose quantize table has no
   16-bit integer mode) move units to FP32.  Then each move is undone,
   latest first, where the target holds without it, so no unit is at a
   higher precision that the target does not need.

What a move writes: :mod:`.precision_moves`.

Reads: the configs of every TARGET op, after calibration, alignment and the
passive pass (and after AdaRound / bias correction when they run); the
executor and the calibration data.
Writes: the moves; ``graph.metadata['quantization']`` keys
``mixed_precision_fp32_ops`` and ``mixed_precision_int16_ops`` (the op
names moved; the second key is named after the width moved to, e.g.
``_int16_``).  The search works on snapshots of the configs and restores
them exactly between trials.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from ..base import QuantizationOptimizationPass, iterate_calibration
from .precision_moves import (can_widen, find_units, move_to_float_format, move_to_fp32, move_to_wider_grid, restore,
                              snapshot)
from ...core.float_formats import float_format
from .sensitivity import AloneRunner, cosine_lower_bound, output_cosine, sample_cosines

__all__ = ["MixedPrecisionPass", "cosine_lower_bound", "output_cosine", "sample_cosines"]

FP32 = "FP32"
#: float formats as TPU-MLIR's quantize table names them
_TPU_FORMAT_NAMES = {"BF16": "BF16", "FP16": "F16"}


def _precision_name(bits: int | str | None) -> str:
    if isinstance(bits, str):   # a float format (TPU-MLIR's F16 / BF16)
        return bits
    return FP32 if bits is None else f"INT{bits}"


class MixedPrecisionPass(QuantizationOptimizationPass):
    """Move the fewest fused units to a higher precision so the output cosine reaches ``target``.

    ``higher_precision_bits``: the platform's wider integer grid (16), tried
    before FP32; None: FP32 only.  ``batches``: calibration batches to
    measure on; ``max_ops``: most ops to move (None: no limit); ``prune``:
    try moves back afterwards.  See the module docstring.
    """

    name = "mixed_precision"

    def __init__(self, target: float = 0.99, batches: int = 2, max_ops: int | None = None, prune: bool = True,
                 verbose: bool = True, higher_precision_bits: int | None = None):
        if not -1.0 < float(target) <= 1.0:
            raise ValueError(f"mixed-precision target cosine must be in (-1, 1], got {target}")
        if isinstance(higher_precision_bits, str):   # a float format: 'BF16' or 'F16' (TPU-MLIR's modes)
            self.bits = _TPU_FORMAT_NAMES.get(float_format(higher_precision_bits).name)
            if self.bits is None:
                raise ValueError(f"a float higher precision must be BF16 or F16, got {higher_precision_bits!r}")
        elif higher_precision_bits is not None and not 4 < int(higher_precision_bits) <= 16:
            raise ValueError(f"higher_precision_bits must be None or in (4, 16], got {higher_precision_bits}")
        else:
            self.bits = None if higher_precision_bits is None else int(higher_precision_bits)
        self.target, self.batches, self.max_ops = float(target), int(batches), max_ops
        self.prune, self.verbose = prune, verbose

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None,
                 held_aside: Iterable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        executor = executor or NumpyExecutor(graph)
        if held_aside is not None:   # batches calibration did not see (quantize_onnx_model holds them aside)
            source, steps = held_aside, None
        else:
            source, steps = dataloader, self.batches if calib_steps is None else min(self.batches, calib_steps)
        data = list(iterate_calibration(source, steps, collate_fn, "mixed precision data", False))
        runner = AloneRunner(graph, executor)
        with dequantized(graph):
            references = [executor.forward(batch) for batch in data]
        units = find_units(graph)
        measured = 0

        def measure() -> float:
            nonlocal measured
            measured += 1
            return cosine_lower_bound(np.concatenate([sample_cosines(executor.forward(b), r)
                                                      for b, r in zip(data, references)]))

        initial = current = measure()
        sensitivity = {i: 0.0 for i in range(len(units))}
        for batch, reference in zip(data, references if initial < self.target else ()):  # none if met
            cached = runner.cache(batch)
            for i, unit in enumerate(units):
                sensitivity[i] += output_cosine(runner.quantize_alone(unit, cached), reference) / len(data)
            del cached

        def apply(moves: dict[int, int | None]) -> None:
            """From the original configs, move each unit to its precision (bits, or None for FP32)."""
            restore(graph, original)
            for i, bits in moves.items():
                move_up(units[i], bits)

        def move_up(unit, bits) -> None:
            if bits is None:
                move_to_fp32(graph, unit)
            elif isinstance(bits, str):
                move_to_float_format(graph, unit, bits)
            else:
                move_to_wider_grid(graph, unit, bits, runner.observed)

        original = snapshot(graph)
        ranking = sorted(range(len(units)), key=lambda i: sensitivity[i])
        steps_to_try = [(i, self.bits) for i in ranking if self.bits is not None
                        and (isinstance(self.bits, str) or can_widen(units[i]))]
        steps_to_try += [(i, None) for i in ranking]
        moves: dict[int, int | None] = {}   # unit -> bits it moved to (None: FP32), in the order moved
        trace = []
        for i, bits in steps_to_try:
            if current >= self.target:
                break
            count = sum(len(units[j]) for j in moves if j != i) + len(units[i])
            if self.max_ops is not None and count > self.max_ops:
                continue
            was_moved = moves.pop(i, False) is not False
            moves[i] = bits
            if was_moved:       # INT16 -> FP32: redo from the original configs
                apply(moves)
            else:
                move_up(units[i], bits)
            current = measure()
            trace.append({"unit": [op.name for op in units[i]], "precision": _precision_name(bits),
                          "cosine": current})
        if self.prune and current >= self.target and len(moves) > 1:
            for i in list(reversed(list(moves)[:-1])):
                trial = {j: b for j, b in moves.items() if j != i}
                apply(trial)
                cosine = measure()
                if cosine >= self.target:
                    moves, current = trial, cosine
                    trace.append({"restored": [op.name for op in units[i]], "cosine": cosine})
            apply(moves)
        moved = {FP32: [op.name for j, b in moves.items() if b is None for op in units[j]]}
        if self.bits is not None:
            moved[_precision_name(self.bits)] = [op.name for j, b in moves.items() if b is not None
                                                 for op in units[j]]
        record = graph.metadata.setdefault("quantization", {})
        for precision, names in moved.items():
            record[f"mixed_precision_{precision.lower()}_ops"] = list(names)
        worst = [{"unit": [op.name for op in units[i]], "cosine_alone": round(sensitivity[i], 6)}
                 for i in ranking[:10]] if initial < self.target else []  # not measured when already met
        return {"target": self.target, "measure": "mean - one standard error of the per-sample output cosine",
                "initial_cosine": initial, "final_cosine": current,
                "reached": bool(current >= self.target), "moved": moved,
                "fp32_op_count": len(moved[FP32]), "fp32_ops": moved[FP32],
                "higher_precision": _precision_name(self.bits), "units": len(units), "measurements": measured,
                "batches": len(data), "held_aside": held_aside is not None,
                "seconds": round(time.perf_counter() - started, 3),
                "most_sensitive": worst, "trace": trace}
