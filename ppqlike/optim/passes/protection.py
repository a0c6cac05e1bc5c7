"""Protection: find the layers whose 8-bit quantization alone wrecks the output, and protect them.

A default has to hold on every family: a quantized Log input, the first depthwise layer of a MobileNet
(its 32 channels' ranges spread over two orders of magnitude, one per-tensor grid for all), an in-model
spectrogram.  This pass finds such layers cheaply, on calibration data, and moves them to the platform's
higher precision.

Measure.  On ``samples`` calibration samples (the batches ``quantize_onnx_model`` holds aside, as many as
hold that many samples; where they hold fewer than ``MIN_SAMPLES``, the last calibration samples join them),
the output error e = 1 - cosine (mean per sample, outputs averaged) of the quantized
graph, e_all, and of each fused unit quantized alone, everything else float
(:class:`.sensitivity.AloneRunner`: a partial forward per unit), e_alone.

Which units are measured alone: the ``measured_units`` (6) that each of two cheap rankings puts first
(one op run per op).  The local error (:meth:`.sensitivity.AloneRunner.local_error`) sees a narrow
channel on a shared per-tensor grid at the unit's own results; the error at its readers
(:meth:`~.sensitivity.AloneRunner.reader_error`) sees the same noise after the reading op's weights,
which tell which channels matter: in PicoDet's backbone a HardSwish output channel 0.26 wide on a grid of
step 0.14, which the depthwise conv reading it multiplies by 40, is 27th by the local error and first at
its readers (TPU_INT8, alone it costs 0.11 of cosine), while the units the local error puts first (Concat
inputs with dead channels) cost nothing alone.

Threshold.  A unit is a candidate when e_alone >= max(``floor``, ``share`` x e_all): quantized alone it
already costs a quarter (``share``) of what the whole quantized graph costs, where a network of N units
spreads its error over all of them (MobileNetV2's first depthwise input: 0.6% alone of 1.3% in all, the
next worst 0.15%), and at least 0.1% of cosine (``floor``: below it, nothing is wrecked).  Candidates are
tried worst first, at most ``max_units``; a move is kept when it takes at least ``gain`` (15%) of the
error away, measured again on the whole quantized graph.  After a front moves (below), the candidates not
kept are tried again, worst first, at most ``max_units``: a unit whose gain the front's error hid (PicoDet,
TPU_INT8: the depthwise input above halves the error left after the front, 0.083 -> 0.037).  Measured and
not taken: holding every measured unit to the threshold against the error left after the front (the PP-OCR
text detector, TRT_INT8: one more conv moved to FP32, held-aside cosine 0.9972 -> 0.9977, dev 0.985 -> 0.960).

Fronts.  Where the error is still at least ``front_floor`` (cosine below 0.995; `best` sets 0.002) after that, the
smallest front of the graph - its first 1, 2, 4, ... units in topological order, each taken on to the end of the
layer it would cut (a written-out HardSwish moves with its Conv), all but the last at most, half of them where the
error is under ``WIDE_FRONT_ERROR`` - whose move halves the error, widened (doubled) while that halves the error
again and it is still at least ``front_floor``, is moved: an in-model signal front end (basic-pitch's CQT, an
STFT, a log-mel) is many units, none of which wrecks the output alone; the report and the verdict list what
moved. Each front is tried at the platform's higher precision, then, unless that brought the
cosine above 0.995, in FP32, and the better kept (in FP32 only with ``float_fronts``: where the runtime computes
the wider grid with float kernels between Q/DQ pairs, onnxruntime's CPU, FP32 is as exact and faster): a power
spectrum read by a Log spans 100 dB and more, which no 16-bit grid holds (the log-mel family, ORT_INT8, held-aside
calibration clips: error 0.108 quantized, 0.031 with the STFT and mel units at INT16, 0.0033 with them in FP32).
Where the higher precision is 8 bits (the platforms whose point is fewer bits: ACADEMIC_MIX's int4 layers,
ACADEMIC_W4A8's 4-bit weights) no front moves, only the candidates, and they move to 8 bits: fronts there took
nearly the whole model off its bits (W4A8 `best` ran 51 of EfficientNet-Lite0's 60 units and 59 of MobileNetV2's in
FP32; at 8 bits `balanced` moved 51, 57 and 59 units of EfficientNet-Lite0, SqueezeNet and MobileNetV2 to 8-bit
weights), which is not a 4-bit model.

Why a front floor of 0.995 and not 0.99: the error is measured on few held-aside samples (8 of
basic-pitch's 2 s clips), and a model just under the floor there can be far from it on other inputs:
basic-pitch TRT_INT8 held-aside error 0.0095, dev cosine 0.970; with the floor at 0.005 its CQT front (32
units) moves to FP32, dev 0.998.  Measured on every family and shared CNN (docs/BENCHMARKS.md, round 10):
the log-mel CNN TRT_INT8 0.986 -> 0.999, MobileNetV2 TRT_INT8 (an 8-unit front, held-aside error 0.0068 ->
0.0024) dev agreement 0.957 -> 0.987; every other cell unchanged (no front halves their error).

Moves (:mod:`.precision_moves`).  Where the platform has a wider integer grid (``higher_precision_bits``:
16 on onnxruntime, TIDL, DSPs) the unit moves to it.  Otherwise to FP32; on a platform whose placement
leaves float tensors between layers at no cost (TensorRT's ``compute_inputs``) the readers of the unit's
tensors read them float; on the others (integer-only hardware such as TPU-MLIR, where a float tensor
means float layers on both sides of it) the reading units move to FP32 too.

Memory.  The partial re-runs read every FP32 intermediate of the measured samples; they are held within
``sensitivity.CACHE_BUDGET_BYTES`` (:class:`.sensitivity.CachedSamples`: batches that do not fit are cut into
pieces and cached again at each visit; a ViT-S on TensorRT's placement held 8.6 GB for 16 images before).

Reads: the configs after calibration, alignment, the passive pass and bias correction; the executor and
calibration data.  Writes: the moves, and ``graph.metadata['quantization']['protected_ops']``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph
from ...core.op_facts import COMPUTING_TYPES
from ...executor import NumpyExecutor
from ..base import QuantizationOptimizationPass
from .precision_moves import (can_widen, find_units, move_to_float_format, move_to_fp32, move_to_wider_grid,
                              reader_units, restore, snapshot, with_pass_through_readers)
from .references import references_of
from .sensitivity import (AloneRunner, CachedSamples, held_aside_or_calibration, output_cosine, output_error,
                          output_parts, sample_count, topped_up)

#: samples the protection measures on, at least: where fewer are held aside, the last calibration samples join
#: them.  PicoDet ORT_INT8 on three 8-image subsets (2 held aside), dev cosine: 0.99091 / 0.99072 / 0.93624
#: measured on 2 (the third's front stopped at 4 units), 0.99127 / 0.99028 / 0.97046 on 4 (docs/BENCHMARKS.md,
#: round 15).
MIN_SAMPLES = 4
#: the held-aside error from which a front may span more than half of the graph's units (balanced's front
#: floor).  Under it (best's floor, 0.002, reaches there) a wider front is not an int8 model any more: with a
#: floor of 0.002 and 100 calibration images, 57 of SqueezeNet's ops went to BF16 on TPU_INT8 for an error of
#: 0.0036 (0.0009 after), and 32 to FP32 on TRT_INT8 (best, 0.0040 -> 0.0016).
WIDE_FRONT_ERROR = 0.005


def layer_ends(units: list) -> list[int]:
    """The graph's first 1, 2, 3, ... layers as front lengths in units: a layer ends where the next unit holding
    a Conv/Gemm/MatMul starts.  Units in topological order; every length when none computes."""
    starts = [index for index, unit in enumerate(units) if any(op.type in COMPUTING_TYPES for op in unit)]
    if not starts:
        return list(range(1, len(units) + 1))
    return [start for start in starts[1:] if start > 0] + [len(units)]


def front_sizes(units: list) -> list[int]:
    """The front lengths the protection tries, in units: 1, 2, 4, ... each taken on to the end of the layer it
    would cut (:func:`layer_ends`), so that a layer's activations written as ops of their own (a HardSwish, an SE
    block's HardSigmoid and Mul) move with it, where that leaves a unit out; no length twice."""
    ends, sizes, count = layer_ends(units), [], 1
    while count < len(units):
        size = min(end for end in ends if end >= count)
        size = size if size < len(units) else count
        if not sizes or size > sizes[-1]:
            sizes.append(size)
        count *= 2
    return sizes


class LayerProtectionPass(QuantizationOptimizationPass):
    """Move the few units whose quantization alone wrecks the output to a higher precision (module docstring)."""

    name = "protection"

    def __init__(self, samples: int = 16, share: float = 0.25, floor: float = 1e-3, gain: float = 0.15,
                 max_units: int = 3, measured_units: int = 6, higher_precision_bits: int | None = None,
                 float_boundaries: bool = False, front_floor: float | None = None, float_fronts: bool = False,
                 verbose: bool = False):
        self.samples, self.share, self.floor, self.gain = int(samples), float(share), float(floor), float(gain)
        self.max_units, self.bits, self.float_boundaries = int(max_units), higher_precision_bits, float_boundaries
        self.measured_units, self.verbose = int(measured_units), verbose
        self.front_floor = WIDE_FRONT_ERROR if front_floor is None else float(front_floor)   # None: balanced's
        self.float_fronts = bool(float_fronts)

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None,
                 held_aside: Iterable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        executor = executor or NumpyExecutor(graph)
        batches = held_aside_or_calibration(held_aside, dataloader, self.samples, collate_fn, "protection data")
        batches = topped_up(batches, held_aside, dataloader, min(self.samples, MIN_SAMPLES), calib_steps, collate_fn,
                            "protection data")
        references = references_of(batches, graph, executor, kwargs.get("references"))

        def error() -> float:
            return output_error(executor, batches, references)

        initial = current = error()
        units = find_units(graph)
        threshold = max(self.floor, self.share * initial)
        runner = AloneRunner(graph, executor)
        candidates = []   # (e_alone, unit), worst first: a unit's e_alone does not depend on the others' precision
        if initial >= self.floor:   # below it nothing is wrecked: no search
            measured = CachedSamples(runner, batches, references)
            ranked = self._ranked(runner, units, measured)
            cosines, parts = {index: [] for index in ranked}, output_parts(graph)
            for cached, reference in measured:
                for index in ranked:
                    cosines[index].append(output_cosine(runner.quantize_alone(units[index], cached), reference,
                                                        parts))
            measured = cached = None   # (the intermediates go before the moves are tried)
            for index in ranked:
                alone = 1.0 - float(np.mean(cosines[index]))
                alone = 1.0 if alone != alone else alone
                if alone >= threshold:
                    candidates.append((alone, units[index]))
            candidates.sort(key=lambda item: -item[0])
        protected = []

        def try_candidates(trying: list, current: float) -> float:
            """Move the first ``max_units`` of ``trying`` (worst first), each kept where it pays."""
            for alone, unit in trying[:self.max_units]:
                original = snapshot(graph)
                precision = self._move(graph, unit, units, runner.observed)
                after = error()
                if after == after and after <= (1.0 - self.gain) * current:
                    current = after
                    protected.append({"ops": [op.name for op in unit], "error_alone": round(alone, 6),
                                      "precision": precision, "error_after": round(after, 6)})
                else:
                    restore(graph, original)
            return current

        current = try_candidates(candidates, current)
        if current >= self.front_floor and self.bits != 8:   # (fronts: see the module docstring)
            front = self._protect_front(graph, units, runner.observed, error, current)
            if front is not None:
                current = front["error_after"]
                protected.append(front)
                # the front's error may have hid what the others gain: those not moved are tried again
                moved = {name for entry in protected for name in entry["ops"]}
                current = try_candidates([(alone, unit) for alone, unit in candidates
                                          if not moved & {op.name for op in unit}], current)
        names = [name for entry in protected for name in entry["ops"]]
        graph.metadata.setdefault("quantization", {})["protected_ops"] = names
        report = {"initial_error": round(initial, 6), "held_aside": held_aside is not None,
                  "batches": len(batches), "samples": sum(sample_count(batch) for batch in batches),
                  "threshold": round(threshold, 6), "candidates": len(candidates), "units": len(units),
                  "protected": protected, "final_error": round(current, 6),
                  "seconds": round(time.perf_counter() - started, 3)}
        return report

    def _ranked(self, runner: AloneRunner, units: list, measured: Iterable) -> list[int]:
        """The indices of the units worth measuring alone (errors summed over ``measured``'s pieces, pairs of
        FP32 intermediates and references): the ``measured_units`` with the largest local error
        (:meth:`AloneRunner.local_error`: a narrow channel on a shared grid), then as many with the largest
        error at their readers (:meth:`AloneRunner.reader_error`: where the reader's weights make a channel
        matter) that are not among them."""
        per_piece = [[] for _ in units]
        for cached, _ in measured:
            for errors, unit in zip(per_piece, units):
                errors.append(runner.unit_errors(unit, cached))
        errors = [np.sum(errors, axis=0) for errors in per_piece]
        local = sorted(((float(error[0]), index) for index, error in enumerate(errors)), reverse=True)
        at_readers = sorted(((float(error[1]), index) for index, error in enumerate(errors)), reverse=True)
        chosen = [index for _, index in local[:self.measured_units]]
        return chosen + [index for _, index in at_readers[:self.measured_units] if index not in chosen]

    def _protect_front(self, graph: Graph, units, observed: dict, error, current: float) -> dict | None:
        """The smallest front of the graph (its first 1, 2, 4, ... units in topological order, each to the end of
        its last layer, :func:`front_sizes`; all units but the last at most) whose move halves the error, then
        twice as wide while that halves the error again and it is still at least ``front_floor``: an in-model
        signal front end (STFT, CQT, log-mel) is many units, none of which wrecks the output alone (basic-pitch's
        CQT is 26 of its 36 units), and a backbone's wrecked layers can span more than the first front that halves
        the error (PicoDet, ORT_INT8, held-aside samples: 8 units 0.119 -> 0.024, 16 units 0.0096).  Wider than
        half of the units only from an error of ``WIDE_FRONT_ERROR`` or more.  None when no front halves the
        error."""
        limit, half = max(1, len(units) - 1), max(1, len(units) // 2)
        original = snapshot(graph)
        found = None
        for size in front_sizes(units):
            if size > limit or (found is not None and found[0] < self.front_floor):
                break
            if size > half and (current if found is None else found[0]) < WIDE_FRONT_ERROR:
                break
            tried = []    # (error after, moving to FP32, precisions): the higher precision first, then FP32
            for to_float in (False, True) if self.bits is not None and not self.float_fronts else (True,):
                precisions = {self._move(graph, unit, units, observed, to_float) for unit in units[:size]}
                tried.append((error(), to_float, precisions))
                restore(graph, original)
                if tried[-1][0] < self.front_floor:   # good enough: no wider move
                    break
            after, to_float, precisions = min(tried, key=lambda entry: entry[0])
            if after <= 0.5 * (current if found is None else found[0]):
                found = (after, to_float, precisions, size)
            elif found is not None:   # no further halving: the front found stands
                break
        if found is None:
            return None
        after, to_float, precisions, size = found
        for unit in units[:size]:
            self._move(graph, unit, units, observed, to_float)
        return {"ops": [op.name for unit in units[:size] for op in unit], "front_units": size,
                "precision": "/".join(sorted(precisions)), "error_after": round(after, 6)}

    def _move(self, graph: Graph, unit, units, observed: dict, to_float: bool = False) -> str:
        """Move ``unit`` to the platform's higher precision (to FP32 with ``to_float``, or where it has none);
        returns the precision's name."""
        if to_float:
            return self._move_to_fp32(graph, unit, units)
        if isinstance(self.bits, str):   # a float format (TPU-MLIR's BF16 / F16 modes): a cast, no range to fit;
            unit = with_pass_through_readers(unit)   # the readers too, as for FP32 (the wrecked range is read there)
            move_to_float_format(graph, unit, self.bits)
            for reader in reader_units(graph, unit, units):
                move_to_float_format(graph, reader, self.bits)
            return self.bits
        if self.bits is not None and can_widen(unit):
            move_to_wider_grid(graph, unit, self.bits, observed)
            return f"INT{self.bits}"
        return self._move_to_fp32(graph, unit, units)

    def _move_to_fp32(self, graph: Graph, unit, units) -> str:
        unit = with_pass_through_readers(unit)
        if self.float_boundaries:
            move_to_fp32(graph, unit, readers="float")
        else:
            move_to_fp32(graph, unit)
            for reader in reader_units(graph, unit, units):
                move_to_fp32(graph, reader)
        return "FP32"
