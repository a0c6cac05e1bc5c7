"""Block reconstruction (BRECQ, Li et al. 2021, with QDrop's dropped quantization, Wei et al. 2022): the weight
rounding of a few consecutive Conv/Gemm layers learned together against the FP32 output of the block they form.

The sequential reconstruction (``reconstruction.py``) learns each layer's rounding against that layer's own FP32
output; a layer's error that the next one could absorb, or that a Relu would hide, counts in full.  Here the
graph is cut into blocks (:func:`partition`): where one tensor alone is live between two ops, consecutive
pieces are joined until a block holds ``block_layers`` layers (a residual branch stays whole, as BRECQ's
residual blocks); a block is trained when the gradient of every op in it is known (``block_gradients``).
Walking the FP32 and quantized networks side by side (``walk.py``), the block's input is what the quantized
network computes with the blocks upstream already rounded, and its layers' soft roundings h(V) (AdaRound's
rectified sigmoid, ``adaround_rounding``) are optimized with Adam on

    sum over the block's outputs of mean((y_q - y_f)^2) / (its value at nearest rounding)
      + lam * sum over its weights of (1 - |2 h(V) - 1|^beta)

where y_q runs the simulation's kernels with every activation quantized as configured, except that each element
of each quantized activation (the block's input included, which then takes its FP32 value) keeps its float
value with probability ``drop`` on every step (QDrop); the rounding's gradient passes a quantizer where the
value lies inside its grid (straight-through).  Each step takes ``batch`` of the walked samples and, where every
op of the block is local, a random window of its input whose outputs are about ``crop`` positions a side (the
FP32 target computed on the same window).  A block runs ``steps`` steps, fewer where the time per step its first
``PROBE_STEPS`` show will not fit its equal share of the time left before ``time_budget`` (each block and each
layer in no block is a share).

A block keeps whichever of the learned rounding, the rounding it came with (``adaround``'s, learned on FP32
inputs) and nearest rounding has the smaller loss on all walked samples with nothing dropped: the pass never
makes a block's output worse there.  Layers outside trainable blocks are reconstructed one at a time as in the
sequential reconstruction, their steps fitted to their share of time likewise (a transformer's MatMuls, which
no block holds, are most of its layers).

Reads: as the sequential reconstruction (weight configs ACTIVATED or BAKED, calibrated activation configs).
Writes: ``config.baked_value``, state BAKED, ``config.detail['reconstruction']`` of each layer.  Stops at
``time_budget``: the blocks and layers not reached keep the rounding they had.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from ...core.ir import Graph
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import input_config, output_config
from ...executor import NumpyExecutor
from ...executor.simulation import apply_config
from .adaround_rounding import PROBE_STEPS, RoundingAdam, SoftRounding, fitted_steps, nearest_rounding
from .adaround_rows import RowHook, as_groups, from_groups
from .block_gradients import LOCAL_TYPES, input_gradients
from .block_partition import Block, partition
from .reconstruction import SequentialReconstructionPass, kept_rounding, reconstruction_targets
from .walk import Walk, walk_inputs

S = QuantizationStates


def _straight_through(config: TensorQuantizationConfig, raw: np.ndarray, quantized: np.ndarray) -> np.ndarray:
    """Where a quantizer's gradient passes: the values it moved by at most half a step (not clipped)."""
    scale = np.asarray(config.scale, np.float32)
    if scale.ndim == 1 and scale.size > 1:
        view = [1] * raw.ndim
        view[config.channel_axis % raw.ndim] = -1
        scale = scale.reshape(view)
    return np.abs(quantized - raw) <= scale * np.float32(0.5001)


def _select(keep: np.ndarray, kept: np.ndarray, other: np.ndarray) -> np.ndarray:
    """np.where(keep, kept, other) for finite floats, in arithmetic (several times quicker than a select)."""
    result = np.multiply(kept, keep, dtype=np.float32)
    result += other * ~keep
    return result


class BlockReconstructionPass(SequentialReconstructionPass):
    """Learn the weight rounding of blocks of ``block_layers`` Conv/Gemm layers against the block's FP32 output
    (module docstring); ``batch``: walked samples per step; the other arguments as the sequential
    reconstruction's (``steps`` per block)."""

    name = "reconstruction"

    def __init__(self, samples: int = 32, rows: int = 4096, steps: int = 1000, drop: float = 0.5,
                 lr: float = 3e-2, lam: float = 0.1, warmup: float = 0.2, seed: int = 0,
                 time_budget=None, verbose: bool = False, batch: int = 8, block_layers: int = 3, crop: int = 16):
        super().__init__(samples, rows, steps, drop, lr, lam, warmup, seed, time_budget, verbose)
        if batch < 1 or block_layers < 1 or crop < 1:
            raise ValueError(f"block reconstruction needs batch, block_layers and crop >= 1; got {batch}, "
                             f"{block_layers}, {crop}")
        self.batch, self.block_layers, self.crop = int(batch), int(block_layers), int(crop)

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        deadline = self.time_budget.deadline()
        targets = reconstruction_targets(graph)
        if not targets:   # nothing to walk for
            return {"blocks": 0, "layers": 0, "seconds": round(time.perf_counter() - started, 3)}
        executor, order = executor or NumpyExecutor(graph), graph.topological_sort()
        blocks = partition(graph, order, targets, self.block_layers)
        starts = {block.operations[0].name: block for block in blocks}
        in_blocks = {name for block in blocks for name in block.layers}
        walk = Walk(graph, executor, walk_inputs(executor, dataloader, calib_steps, collate_fn, self.samples,
                                                 "reconstruction data"))
        sampler, rng = RowHook({}, self.rows, self.seed), np.random.default_rng(self.seed)
        layers, block_facts, budget_spent = [], [], False
        units = len(blocks) + len(targets - in_blocks)   # each block and each layer in none: an equal share

        def share() -> float:
            return (deadline - time.perf_counter()) / max(units - len(block_facts) - len(layers), 1)

        for operation in tqdm(order, desc="block reconstruction", disable=not self.verbose, leave=False):
            if len(block_facts) + len(layers) == units:
                break   # every block and layer done: nothing downstream to walk for
            if time.perf_counter() >= deadline:
                budget_spent = True   # the blocks and layers left keep their rounding: no need to walk further
                break
            if operation.name in starts:
                block_facts.append(self._reconstruct_block(starts[operation.name], walk, executor, rng, deadline,
                                                           share()))
            float_results = walk.run_float(operation)
            if operation.name in targets and operation.name not in in_blocks:
                layers.append(self._reconstruct(operation, walk, sampler, deadline, share()))
            walk.finish(operation, float_results, walk.run_quantized(operation))
        kept = [facts["kept"] for facts in block_facts]
        return {"blocks": len(block_facts), "block_layers": sum(len(b.layers) for b in blocks),
                "mean_steps": round(float(np.mean([f["steps_done"] for f in block_facts])), 1) if block_facts else 0,
                "layers": len(layers), "targets": len(targets), "samples": self.samples, "drop": self.drop,
                "blocks_learned": kept.count("learned"), "blocks_previous": kept.count("previous"),
                "blocks_nearest": kept.count("nearest"), "budget_spent": budget_spent,
                "seconds": round(time.perf_counter() - started, 3)}

    # ------------------------------------------------------------------ one block
    def _forward(self, block: Block, weights: dict, inputs: dict, float_inputs: dict | None,
                 rng: np.random.Generator | None, executor: NumpyExecutor, quantized: bool = True):
        """The block's outputs and its tape [(op, arguments, input gates, output gate)].  ``quantized``:
        through the configs (dropping with ``rng`` unless None); otherwise the FP32 block on ``inputs``."""
        values, tape = {}, []
        for operation in block.operations:
            arguments, gates = [], []
            for index, variable in enumerate(operation.inputs):
                gate = None
                if variable is None:
                    value = None
                elif index == 1 and operation.name in weights:
                    value = weights[operation.name]
                elif variable.name in values or variable.name in inputs:
                    entry = variable.name not in values
                    raw = inputs[variable.name] if entry else values[variable.name]
                    value = raw
                    if quantized:
                        config = input_config(operation, index)
                        value = apply_config(config, raw)
                        if value is not raw:
                            gate = _straight_through(config, raw, value)
                        if rng is not None and self.drop > 0 and (entry or value is not raw):
                            keep = self._dropped(rng, raw.shape)
                            value = _select(keep, float_inputs[variable.name] if entry else raw, value)
                            gate = keep if gate is None else (gate | keep)
                else:
                    value = variable.value if not quantized else apply_config(input_config(operation, index),
                                                                              variable.value)
                arguments.append(value)
                gates.append(gate)
            result = executor.run_operation(operation, arguments, quantized=False)[0]
            out_gate = None
            if quantized:
                config = output_config(operation, 0)
                raw, result = result, apply_config(config, result)
                if result is not raw:
                    out_gate = _straight_through(config, raw, result)
                    if rng is not None and self.drop > 0 and operation.outputs[0].name not in block.outputs:
                        keep = self._dropped(rng, raw.shape)
                        result = _select(keep, raw, result)
                        out_gate = out_gate | keep
            values[operation.outputs[0].name] = result
            tape.append((operation, arguments, gates, out_gate))
        return {name: values[name] for name in block.outputs}, tape

    def _dropped(self, rng: np.random.Generator, shape: tuple) -> np.ndarray:
        """Where a quantizer keeps the float value this step (probability ``drop`` per element)."""
        if self.drop == 0.5:
            return rng.integers(0, 2, size=shape, dtype=np.bool_)
        return rng.random(shape, dtype=np.float32) < self.drop

    @staticmethod
    def _backward(block: Block, tape: list, output_gradients: dict) -> dict:
        """The gradients of the block's learned weights (op name -> dW) from those of its outputs."""
        gradients, weight_gradients = dict(output_gradients), {}
        made = {operation.outputs[0].name for operation, *_ in tape}
        for operation, arguments, gates, out_gate in reversed(tape):
            dy = gradients.pop(operation.outputs[0].name, None)
            if dy is None:
                continue
            if out_gate is not None:
                dy = dy * out_gate
            for index, (variable, gradient) in enumerate(zip(operation.inputs,
                                                             input_gradients(operation, arguments, dy))):
                if gradient is None or variable is None:
                    continue
                if index == 1 and operation.name in block.layers:
                    weight_gradients[operation.name] = gradient
                elif variable.name in made:
                    if gates[index] is not None:
                        gradient = gradient * gates[index]
                    gradients[variable.name] = gradients[variable.name] + gradient \
                        if variable.name in gradients else gradient
        return weight_gradients

    def _cropper(self, block: Block, inputs: dict, targets: dict) -> Callable:
        """A function of the random generator giving each step's window of the block's inputs: () (the whole
        input) unless every op is local (``block_gradients.LOCAL_TYPES``) and the outputs are more than
        ``crop`` positions high or wide; then a random window of the inputs whose outputs are about ``crop``
        positions on each side, at a multiple of the block's stride."""
        shapes = [np.shape(value) for value in inputs.values()]
        out_shapes = [np.shape(value) for value in targets.values()]
        if any(op.type not in LOCAL_TYPES for op in block.operations) or \
                any(len(shape) != 4 or shape[2:] != shapes[0][2:] for shape in shapes) or \
                any(len(shape) != 4 for shape in out_shapes):
            return lambda rng: ()
        height, width = shapes[0][2:]
        stride_h = max(1, height // min(shape[2] for shape in out_shapes))
        stride_w = max(1, width // min(shape[3] for shape in out_shapes))
        window_h, window_w = min(height, self.crop * stride_h), min(width, self.crop * stride_w)
        if window_h == height and window_w == width:
            return lambda rng: ()

        def window(rng):
            top = int(rng.integers(0, (height - window_h) // stride_h + 1)) * stride_h
            left = int(rng.integers(0, (width - window_w) // stride_w + 1)) * stride_w
            return (slice(None), slice(None), slice(top, top + window_h), slice(left, left + window_w))
        return window

    def _losses(self, block: Block, weights: dict, inputs: dict, targets: dict, executor) -> list[float]:
        """Mean squared error of each output on all walked samples, nothing dropped."""
        count = len(next(iter(inputs.values())))
        errors = np.zeros(len(block.outputs))
        for begin in range(0, count, self.batch):
            part = {name: value[begin:begin + self.batch] for name, value in inputs.items()}
            outputs, _ = self._forward(block, weights, part, None, None, executor)
            for k, name in enumerate(block.outputs):
                errors[k] += float(np.sum((outputs[name] - targets[name][begin:begin + self.batch]) ** 2))
        return [e / targets[name].size for e, name in zip(errors, block.outputs)]

    def _reconstruct_block(self, block: Block, walk: Walk, executor: NumpyExecutor, rng: np.random.Generator,
                           deadline: float, share: float) -> dict:
        """Learn, judge and bake one block's rounding in ``share`` seconds at most (inf: ``steps``); its facts."""
        begin = time.perf_counter()
        quantized_inputs = {name: walk.quantized_values[name].astype(np.float32) for name in block.inputs}
        float_inputs = {name: walk.float_values[name].astype(np.float32) for name in block.inputs}
        count = len(next(iter(float_inputs.values())))
        targets = {}
        for start in range(0, count, self.batch):
            outputs, _ = self._forward(block, {}, {n: v[start:start + self.batch] for n, v in float_inputs.items()},
                                       None, None, executor, quantized=False)
            for name, value in outputs.items():
                targets.setdefault(name, []).append(value)
        targets = {name: np.concatenate(values) for name, values in targets.items()}
        operations = {op.name: op for op in block.operations}
        configs = {name: input_config(operations[name], 1) for name in block.layers}
        shapes = {name: operations[name].inputs[1].value.shape for name in block.layers}
        nearest = {name: from_groups(operations[name], nearest_rounding(operations[name], configs[name]),
                                     shapes[name]).astype(np.float32) for name in block.layers}
        previous = {name: np.asarray(configs[name].baked_value, np.float32) for name in block.layers
                    if configs[name].state is S.BAKED and configs[name].baked_value is not None}
        evaluated = time.perf_counter()
        nearest_losses = self._losses(block, nearest, quantized_inputs, targets, executor)
        evaluation = time.perf_counter() - evaluated     # the end judges two more roundings so
        norms = [1.0 / max(loss, 1e-30) for loss in nearest_losses]
        cropper = self._cropper(block, float_inputs, targets)
        rounders = {name: SoftRounding(operations[name], configs[name]) for name in block.layers}
        adams = {name: RoundingAdam(rounder, self.lr, self.lam) for name, rounder in rounders.items()}
        steps = self.steps if sum(nearest_losses) > 1e-24 else 0
        start = int(self.warmup * steps)
        learning_began = time.perf_counter()
        t = 0
        while t < steps:
            if t == PROBE_STEPS and share < float("inf"):   # the block's steps: as many as its share of time holds
                steps = fitted_steps(steps, share - (learning_began - begin) - 2 * evaluation,
                                     time.perf_counter() - learning_began)
                start = int(self.warmup * steps)
                if t >= steps:
                    break
            if t % 16 == 0 and time.perf_counter() >= deadline:
                break
            picked = np.sort(rng.choice(count, size=min(self.batch, count), replace=False))
            soft = {}
            weights = {}
            for name, rounder in rounders.items():
                h, raw, sig = rounder.soft()
                approx, inside = rounder.weight(h)
                soft[name] = (h, raw, sig, inside)
                weights[name] = from_groups(operations[name], approx, shapes[name])
            window = cropper(rng)
            step_float = {n: v[picked][window] for n, v in float_inputs.items()}
            if window == ():
                step_targets = {name: value[picked] for name, value in targets.items()}
            else:
                step_targets, _ = self._forward(block, {}, step_float, None, None, executor, quantized=False)
            outputs, tape = self._forward(block, weights, {n: v[picked][window] for n, v in quantized_inputs.items()},
                                          step_float, rng, executor)
            output_gradients = {}
            for k, name in enumerate(block.outputs):
                difference = outputs[name] - step_targets[name]
                output_gradients[name] = (2.0 * norms[k] / difference.size) * difference
            weight_gradients = self._backward(block, tape, output_gradients)
            for name, rounder in rounders.items():
                h, raw, sig, inside = soft[name]
                gradient = as_groups(operations[name], weight_gradients[name]) * rounder.scale * inside
                adams[name].step(t, start, steps, gradient, h, raw, sig)
            t += 1
        done = t
        learned = {name: from_groups(operations[name], rounder.weight(rounder.hard())[0], shapes[name]).astype(
            np.float32) for name, rounder in rounders.items()}
        candidates = {"nearest": nearest, "learned": learned}
        if len(previous) == len(block.layers):
            candidates["previous"] = previous
        losses = {"nearest": sum(nearest_losses)}
        for name in ("learned", "previous"):
            if name in candidates:
                losses[name] = sum(self._losses(block, candidates[name], quantized_inputs, targets, executor))
        kept = kept_rounding(losses)
        for name in block.layers:
            config = configs[name]
            config.baked_value = candidates[kept][name]
            if config.state is not S.BAKED:
                config.state = S.BAKED
            config.detail["reconstruction"] = {"block": block.layers, "kept": kept,
                                               **{f"loss_{k}": round(v, 10) for k, v in losses.items()},
                                               "steps_done": done}
        return {"layers": block.layers, "kept": kept, "losses": losses, "steps_done": done,
                "seconds": round(time.perf_counter() - begin, 3)}
