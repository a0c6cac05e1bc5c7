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

from ...core.ir import Graph
from ...executor import NumpyExecutor
from ..base import QuantizationOptimizationPass, iterate_calibration
from ..distributed import map_items
from .precision_moves import can_widen, find_units
from .precision_trials import TrialData, move_unit, trial_cosines, unit_sensitivities
from ...core.float_formats import float_format
from .references import references_of
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
                 verbose: bool = True, higher_precision_bits: int | None = None, backend: str = "local",
                 workers: int = 2):
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
        self.backend, self.workers = backend, workers

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
        references = references_of(data, graph, executor, kwargs.get("references"))
        units = find_units(graph)
        shared = TrialData(graph, data, references, [[op.name for op in unit] for unit in units],
                           runtime_kernels=executor.runtime_kernels, local_executor=executor)
        # trials measured at once: one per worker (the later ones speculative), one at a time here
        width = self.workers if self.backend == "ray" else 1
        measured, workers_seconds = 0, []

        def measure_trials(trials: list) -> list[float]:
            mapped = map_items(trial_cosines, shared, trials, self.backend, self.workers)
            workers_seconds.extend(mapped.worker_seconds)
            return mapped.results

        initial = current = measure_trials([[]])[0]
        measured += 1
        sensitivity = {i: 0.0 for i in range(len(units))}
        if initial < self.target:
            shared.local_runner = runner   # here, it notes the FP32 range of every tensor on the way
            mapped = map_items(unit_sensitivities, shared, list(range(len(units))), self.backend, self.workers)
            workers_seconds.extend(mapped.worker_seconds)
            sensitivity = dict(enumerate(mapped.results))
            if mapped.worker_seconds:   # measured on workers: the ranges (a move to a wider grid reads them)
                for batch in data:
                    runner.cache(batch)
            shared.observed = runner.observed

        ranking = sorted(range(len(units)), key=lambda i: sensitivity[i])
        steps_to_try = [(i, self.bits) for i in ranking if self.bits is not None
                        and (isinstance(self.bits, str) or can_widen(units[i]))]
        steps_to_try += [(i, None) for i in ranking]
        moves: dict[int, int | None] = {}   # unit -> bits it moved to (None: FP32), in the order moved
        trace = []
        position = 0
        while position < len(steps_to_try) and current < self.target:
            # the next trials as if none reached the target: each adds one move to the one before
            trials, ends, speculative = [], [], dict(moves)
            while position < len(steps_to_try) and len(trials) < width:
                i, bits = steps_to_try[position]
                position += 1
                count = sum(len(units[j]) for j in speculative if j != i) + len(units[i])
                if self.max_ops is not None and count > self.max_ops:
                    continue
                speculative.pop(i, None)   # INT16 -> FP32: moved again, last
                speculative[i] = bits
                trials.append(list(speculative.items()))
                ends.append(position)
            for trial, end, cosine in zip(trials, ends, measure_trials(trials) if trials else ()):
                measured += 1
                moves, current, position = dict(trial), cosine, end
                index, bits = trial[-1]
                trace.append({"unit": [op.name for op in units[index]], "precision": _precision_name(bits),
                              "cosine": current})
                if current >= self.target:   # the later trials are not taken
                    break
        if self.prune and current >= self.target and len(moves) > 1:
            candidates, next_candidate = list(reversed(list(moves)[:-1])), 0
            while next_candidate < len(candidates):
                chunk = candidates[next_candidate:next_candidate + width]
                trials = [[(j, b) for j, b in moves.items() if j != i] for i in chunk]
                for i, trial, cosine in zip(chunk, trials, measure_trials(trials)):
                    measured += 1
                    next_candidate += 1
                    if cosine >= self.target:   # taken: the later trials assumed it was not
                        moves, current = dict(trial), cosine
                        trace.append({"restored": [op.name for op in units[i]], "cosine": cosine})
                        break
        for i, bits in moves.items():
            move_unit(graph, units[i], bits, runner.observed)
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
                "seconds": round(time.perf_counter() - started, 3), "backend": self.backend,
                **({"worker_tasks": len(workers_seconds), "worker_seconds": round(sum(workers_seconds), 3)}
                   if workers_seconds else {}),
                "most_sensitive": worst, "trace": trace}
