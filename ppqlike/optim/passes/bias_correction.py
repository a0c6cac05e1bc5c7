"""Empirical bias correction: remove the mean error that weight quantization adds to each output channel.

Quantized weights W_q = W + dW shift the mean of a layer's output:
E[W_q x] - E[W x] = E[dW x], per output channel (Nagel et al. 2019, sec. 4.2;
Finkelstein et al. 2019).  The pass measures that shift on calibration data
and subtracts it from the bias, so E[y_q] = E[y] channel by channel.

How it is measured.  One quantized forward pass per calibration batch, with
a hook before every corrected op: the op's input x is taken as the op sees
it in the quantized model (quantized upstream, the op's own input
quantization applied) and the mean over samples and output positions of
op(x) with the weight error dW = W_q - W as its weight and no bias is added
to a running sum (fixed memory: one float64 per output channel and op; no
activation is kept).  The op is linear in its weight, so for a 2-D Conv
that mean is sum over input channels and kernel offsets of dW times the
mean input value each offset reads (k*k strided slices of the batch-mean
image, padding included), and for a Gemm dW applied to the mean row: a
fraction of the cost of running the op again, which is what other layouts
(ConvTranspose, auto_pad SAME) do.  All ops are
measured in the same passes, so a correction does not see the corrections
of the ops before it (a second-order effect: the mean of x moves by the
upstream correction only).  Each op corrects the error of its own weights,
never the errors of other layers or of activation quantization, so nothing
is corrected twice.

Reads: ACTIVATED or BAKED weight configs of TARGET Conv, ConvTranspose and
Gemm ops (W_q is the fake-quantized weight, or ``baked_value`` when a pass
such as AdaRound already baked it), the calibrated activation configs (the
quantized forward pass), PASSIVE bias configs.
Writes, per corrected op:

* a quantized bias (PASSIVE config, scale S_input * S_weight): the pass
  bakes it: ``baked_value`` = the corrected bias quantized on that scale,
  state PASSIVE_BAKED (the baking pass leaves it alone).  ``Variable.value``
  keeps the FP32 bias, so the FP32 model (``dequantized``, analysis, an op
  that mixed precision moves to FP32) is the original one;
* a float bias (no config: TensorRT-style platforms, or an FP32 config):
  ``Variable.value`` itself, which is what runs and is exported; the report
  lists these ops (``float_biases_changed``), whose FP32 reference now
  includes the correction;
* an op without a bias is left alone (reported) unless ``create_biases``: a
  bias it never had moves what the op makes of a zero input (an STFT
  convolution's silence became a -2.5 dB floor on openWakeWord's log-mel
  front end); NNCF likewise corrects only ops with a bias.  With
  ``create_biases`` it gets a zero bias parameter (``<op>.bias_correction``,
  so the FP32 function is unchanged) at input slot 2 and a config for it:
  where the platform quantizes biases (``new_bias='int32'``, which
  ``build_pipeline`` passes from the platform policy; when not told, when
  other computing ops of the graph have bias configs) one made like the
  platform quantizer makes bias configs (int32, symmetric, per channel when
  the weight is), linked PASSIVE to [input, weight] and baked as above;
  otherwise None, and the correction goes into the float value.

Biases that are already baked, shared with other ops or not one value per
output channel are left alone (reported).  No other state changes.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation
from ...core.op_facts import BIAS_TYPES, output_channels
from ...core.quant import (QuantizationPolicy, QuantizationProperty, QuantizationStates,
                           TensorQuantizationConfig)
from ...core.quant_graph import configured_operations, input_config
from ...executor import NumpyExecutor, OperationHook
from ...executor.simulation import dequantized
from ..base import QuantizationOptimizationPass, TimeBudget, iterate_calibration
from .precision_moves import restore, snapshot
from .references import check_data
from .sensitivity import output_error, sample_count

S = QuantizationStates
P = QuantizationProperty


def quantized_weight(config: TensorQuantizationConfig, value: np.ndarray) -> np.ndarray | None:
    """The weight as the quantized model uses it (None when the config does not quantize it)."""
    if config is None:
        return None
    if config.state is S.BAKED and config.baked_value is not None:
        return np.asarray(config.baked_value)
    if config.state is S.ACTIVATED:
        return config.fake_quantize(value)
    return None


def _conv_error_mean(operation: Operation, x: np.ndarray, delta: np.ndarray) -> np.ndarray | None:
    """E over batch and output positions of conv(x, delta) per output channel, without running the conv.

    By linearity it is sum over (input channel, kernel offset) of delta times the mean of the input
    values that offset reads, and those means are k*k strided slices of the batch-mean image.
    None where the layout is not the plain 2-D case (the caller then runs the conv).
    """
    attributes = operation.attributes
    auto_pad = attributes.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if x.ndim != 4 or delta.ndim != 4 or auto_pad not in ("NOTSET", "VALID"):
        return None
    kh, kw = delta.shape[2:]
    sh, sw = [int(v) for v in attributes.get("strides", [1, 1])]
    dh, dw = [int(v) for v in attributes.get("dilations", [1, 1])]
    top, left, bottom, right = [int(v) for v in attributes.get("pads", [0, 0, 0, 0])] if auto_pad == "NOTSET" \
        else (0, 0, 0, 0)
    group = int(attributes.get("group", 1))
    mean = x.mean(axis=0, dtype=np.float64)                                   # [C, H, W]
    mean = np.pad(mean, ((0, 0), (top, bottom), (left, right)))
    out_h = (mean.shape[1] - dh * (kh - 1) - 1) // sh + 1
    out_w = (mean.shape[2] - dw * (kw - 1) - 1) // sw + 1
    if out_h < 1 or out_w < 1:
        return None
    taps = np.empty((mean.shape[0], kh, kw))
    for i in range(kh):
        for j in range(kw):
            window = mean[:, i * dh: i * dh + sh * (out_h - 1) + 1: sh, j * dw: j * dw + sw * (out_w - 1) + 1: sw]
            taps[:, i, j] = window.mean(axis=(1, 2))
    out_channels, per_group = delta.shape[0], delta.shape[1]
    grouped_delta = delta.astype(np.float64).reshape(group, out_channels // group, per_group, kh, kw)
    grouped_taps = taps.reshape(group, per_group, kh, kw)
    return np.einsum("gockl,gckl->go", grouped_delta, grouped_taps).reshape(out_channels)


def _gemm_error_mean(operation: Operation, x: np.ndarray, delta: np.ndarray) -> np.ndarray | None:
    if x.ndim != 2 or operation.attributes.get("transA", 0):
        return None
    weight = delta.T if operation.attributes.get("transB", 0) else delta          # [K, M]
    return float(operation.attributes.get("alpha", 1.0)) * (x.mean(axis=0, dtype=np.float64) @ weight)


def _channel_mean(executor: NumpyExecutor, operation: Operation, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """E over batch and output positions of the op (Conv, ConvTranspose or Gemm) on ``x`` with ``weight`` and
    no bias, per output channel: from the batch-mean input where the layout allows, else by running it."""
    mean = _conv_error_mean(operation, x, weight) if operation.type == "Conv" else \
        _gemm_error_mean(operation, x, weight) if operation.type == "Gemm" else None
    if mean is None:
        arguments = [x, weight] + ([None] if operation.type == "Gemm" else [])
        output = executor.run_operation(operation, arguments, quantized=False)[0].astype(np.float64)
        mean = output.mean(axis=tuple(a for a in range(output.ndim) if a != 1))
    return mean


class _LayerErrorHook(OperationHook):
    """Before each watched op of an FP32 run: the channel means of op(Q(x), W_q) - op(x, W), no bias, where
    x is the op's FP32 input and Q its input quantization (``scope='layer'``: the op's own error, weights
    and input grid, as NNCF's fast bias correction measures it; never errors of the ops before it)."""

    def __init__(self, executor: NumpyExecutor, weights: dict[str, tuple], quantizers: dict[str, Callable]):
        self.executor, self.weights, self.quantizers = executor, weights, quantizers
        self.sums = {name: 0.0 for name in weights}
        self.counts = {name: 0 for name in weights}

    def before_operation(self, operation: Operation, inputs: list):
        if operation.name not in self.weights:
            return None
        x, (fp32, quantized) = np.asarray(inputs[0], np.float32), self.weights[operation.name]
        quantizer = self.quantizers.get(operation.name)
        seen = quantizer(x, np.empty_like(x)) if quantizer is not None else x
        error = _channel_mean(self.executor, operation, seen, quantized) - \
            _channel_mean(self.executor, operation, x, fp32)
        self.sums[operation.name] = self.sums[operation.name] + error * x.shape[0]
        self.counts[operation.name] += x.shape[0]
        return None


class _ErrorHook(OperationHook):
    """Before each watched op: the channel means of (op with weight dW, no bias) on its quantized input."""

    def __init__(self, executor: NumpyExecutor, deltas: dict[str, np.ndarray]):
        self.executor, self.deltas = executor, deltas
        self.sums = {name: 0.0 for name in deltas}
        self.counts = {name: 0 for name in deltas}

    def before_operation(self, operation: Operation, inputs: list):
        delta = self.deltas.get(operation.name)
        if delta is None:
            return None
        x = inputs[0]
        weight = x.shape[0]  # batches of any size are weighted by their number of samples
        mean = _channel_mean(self.executor, operation, x, delta)
        self.sums[operation.name] = self.sums[operation.name] + mean * weight
        self.counts[operation.name] += weight
        return None


def _bias_config(graph: Graph, operation: Operation, name: str) -> TensorQuantizationConfig | None:
    """A PASSIVE int32 bias config linked to the op's input and weight configs (as the quantizer makes them)."""
    data, weight = input_config(operation, 0), input_config(operation, 1)
    if data is None or weight is None or data.scale is None or weight.scale is None:
        return None
    per_channel = bool(weight.policy.per_channel)
    policy = QuantizationPolicy((P.PER_CHANNEL if per_channel else P.PER_TENSOR) | P.LINEAR | P.SYMMETRICAL)
    config = TensorQuantizationConfig(policy, weight.rounding, 32, -(2 ** 31), 2 ** 31 - 1,
                                      observer_algorithm="passive", channel_axis=0 if per_channel else None,
                                      name=name)
    config.state = S.PASSIVE_INIT
    config.dominated_by([data, weight], S.PASSIVE)
    return config


def _graph_quantizes_bias(graph: Graph) -> bool:
    for operation in configured_operations(graph):
        config = input_config(operation, 2)
        if operation.type in BIAS_TYPES and config is not None and config.state is not S.FP32:
            return True
    return False


def _undo(graph: Graph, configs: dict, float_values: dict, created: list) -> None:
    """Put back the configs, the float bias values and the biases as they were before the correction."""
    restore(graph, configs)
    for bias, value in float_values.values():
        bias.value = value
    for operation, bias, slots in created:
        graph.replace_input(operation, 2, None)
        del operation.inputs[2:]
        del operation.config.input_quantization_config[slots:]
        graph.remove_variable(bias)


class BiasCorrectionPass(QuantizationOptimizationPass):
    """Per-channel empirical bias correction of Conv/ConvTranspose/Gemm (see the module docstring).

    ``create_biases``: give ops without a bias one to correct (off: they are skipped, their zero input
    staying a zero output).  ``steps``: calibration batches to measure on (None: the pipeline's
    ``calib_steps``); ``samples``: no batch is read once that many samples are
    measured (None: no such limit).  ``new_bias``: 'int32', 'float' or None (decide from
    the graph) for the config of a bias the pass has to create.  ``time_budget``
    (a TimeBudget, seconds or None): no batch is started past its deadline (the mean error is then taken
    over fewer batches; past it at the start, nothing is corrected).  ``checked_on``: the output
    error (1 - cosine against FP32) is measured before and after on that many samples (the held-aside batches
    where the pipeline has them, else the calibration data) and the corrections are undone unless it fell:
    a mean shift fitted on a few samples is not safe on every family (a text detector's probability map).
    """

    name = "bias_correction"

    def __init__(self, steps: int | None = None, new_bias: str | None = None, verbose: bool = True,
                 scope: str = "weights", time_budget: TimeBudget | float | None = None, samples: int | None = None,
                 checked_on: int | None = None, create_biases: bool = False):
        if new_bias not in (None, "int32", "float"):
            raise ValueError(f"new_bias must be 'int32', 'float' or None, not {new_bias!r}")
        if scope not in ("weights", "layer"):
            raise ValueError(f"scope must be 'weights' or 'layer', not {scope!r}")
        self.steps, self.new_bias, self.verbose, self.scope = steps, new_bias, verbose, scope
        self.samples, self.checked_on, self.create_biases = samples, checked_on, create_biases
        self.time_budget = TimeBudget.of(time_budget)

    def _layer_hook(self, graph: Graph, executor: NumpyExecutor, deltas: dict) -> _LayerErrorHook:
        weights, quantizers = {}, {}
        for name, delta in deltas.items():
            operation = graph.operations[name]
            fp32 = operation.inputs[1].value.astype(np.float32)
            weights[name] = (fp32, fp32 + delta)
            config = input_config(operation, 0)
            if config is not None and config.scale is not None and config.state in (S.ACTIVATED, S.OVERLAPPED,
                                                                                     S.PASSIVE, S.SLAVE):
                quantizers[name] = config.fake_quantizer() if not config.policy.per_channel else \
                    (lambda x, out, config=config: config.fake_quantize(x))
        return _LayerErrorHook(executor, weights, quantizers)

    def _targets(self, graph: Graph) -> tuple[dict, list]:
        deltas, skipped = {}, []
        for operation in configured_operations(graph):
            if operation.type not in BIAS_TYPES or len(operation.inputs) < 2:
                continue
            weight = operation.inputs[1]
            if weight is None or not weight.is_parameter:
                continue
            quantized = quantized_weight(input_config(operation, 1), weight.value)
            if quantized is None:
                skipped.append({"op": operation.name, "reason": "weight is not quantized"})
                continue
            bias = operation.inputs[2] if len(operation.inputs) > 2 else None
            channels = output_channels(operation)
            if bias is None and not self.create_biases:
                skipped.append({"op": operation.name, "reason": "no bias (one created would move the output of a "
                                                                "zero input)"})
                continue
            if bias is not None:
                config = input_config(operation, 2)
                if not bias.is_parameter or bias.value.size != channels or \
                        (operation.type == "Gemm" and bias.value.ndim != 1):
                    skipped.append({"op": operation.name, "reason": "bias is not one constant per output channel"})
                    continue
                if len([c for c in bias.consumers if c is not operation]):
                    skipped.append({"op": operation.name, "reason": "bias is shared with another op"})
                    continue
                if config is not None and config.state not in (S.PASSIVE, S.PASSIVE_INIT, S.FP32, S.DEACTIVATED):
                    skipped.append({"op": operation.name, "reason": f"bias config is {config.state.name}"})
                    continue
            if operation.type == "Gemm" and float(operation.attributes.get("beta", 1.0)) == 0.0:
                skipped.append({"op": operation.name, "reason": "Gemm with beta = 0 ignores its bias"})
                continue
            delta = quantized.astype(np.float32) - weight.value.astype(np.float32)
            if not delta.any():   # weights already on their grid (MobileNetV2's): no error to correct
                skipped.append({"op": operation.name, "reason": "weight quantization is exact"})
                continue
            deltas[operation.name] = delta
        return deltas, skipped

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        executor = executor or NumpyExecutor(graph)
        deltas, skipped = self._targets(graph)
        if not deltas:
            return {"corrected": 0, "skipped": len(skipped), "ops": [], "skipped_ops": skipped}
        deadline = self.time_budget.deadline()
        if time.perf_counter() >= deadline:   # the passes before spent the budget: the wall time is the user's
            return {"corrected": 0, "batches": 0, "budget_spent": True, "skipped": len(skipped), "ops": [],
                    "skipped_ops": skipped}
        if kwargs.get("references") is not None:   # the FP32 references, before a float bias changes
            kwargs["references"].keep()
        hook = _ErrorHook(executor, deltas) if self.scope == "weights" else self._layer_hook(graph, executor, deltas)
        steps = self.steps if self.steps is not None else calib_steps
        batches, samples, budget_spent = 0, 0, False
        for batch in iterate_calibration(dataloader, steps, collate_fn, "bias correction", self.verbose):
            if self.scope == "weights":
                executor.forward(batch, hooks=[hook])
            else:
                with dequantized(graph):
                    executor.forward(batch, hooks=[hook])
            batches += 1
            samples += sample_count(batch)
            if self.samples is not None and samples >= self.samples:   # enough: no further batch is drawn
                break
            if time.perf_counter() >= deadline:   # no further batch is drawn
                budget_spent = True
                break
        check = check_data(graph, executor, dataloader, self.checked_on, collate_fn, kwargs,
                           "bias correction check data") if self.checked_on else None
        error_before = output_error(executor, *check) if check else None
        configs_before = snapshot(graph) if check else None
        float_values, created_biases = {}, []   # bias name -> (variable, FP32 value); (op, bias, config slots)
        new_bias = self.new_bias or ("int32" if _graph_quantizes_bias(graph) else "float")
        details, created, float_biases = [], 0, []
        for name in deltas:
            operation = graph.operations[name]
            if hook.counts[name] == 0:
                skipped.append({"op": name, "reason": "not reached by the calibration data"})
                continue
            error = hook.sums[name] / hook.counts[name]                  # E[dW x] per output channel
            if operation.type == "Gemm":
                error = error / float(operation.attributes.get("beta", 1.0))
            bias = operation.inputs[2] if len(operation.inputs) > 2 else None
            configs = operation.config.input_quantization_config
            if bias is None:
                # a zero bias leaves the FP32 function as it was; the correction goes where the quantized
                # model reads it (the baked value), or into the value itself when the bias stays float
                bias = graph.create_variable(graph.unique_name(f"{name}.bias_correction"),
                                             value=np.zeros(error.shape, np.float32))
                graph.replace_input(operation, 2, bias)
                created_biases.append((operation, bias, len(configs)))
                configs.extend([None] * (3 - len(configs)))
                configs[2] = _bias_config(graph, operation, bias.name) if new_bias == "int32" else None
                created += 1
            config = configs[2] if len(configs) > 2 else None
            corrected = bias.value.astype(np.float64) - error
            if config is not None and config.state in (S.PASSIVE, S.PASSIVE_INIT) and config.scale is not None:
                if config.state is S.PASSIVE_INIT:
                    config.dominated_by([input_config(operation, 0), input_config(operation, 1)], S.PASSIVE)
                baked = config.fake_quantize(corrected.astype(np.float32))
                codes = config.quantize(baked)
                if codes.min() <= config.quant_min or codes.max() >= config.quant_max:
                    # a saturated code (2^31 - 1 for an int32 bias) is 2^31 again once read back from its float32
                    # value: the baking pass bakes the FP32 bias as usual, whose codes the exporter has
                    skipped.append({"op": name, "reason": "the corrected bias saturates its grid"})
                    continue
                config.baked_value, config.state, where = baked, S.PASSIVE_BAKED, "baked"
            else:
                float_values.setdefault(bias.name, (bias, bias.value))
                bias.value = corrected.astype(bias.value.dtype)
                float_biases.append(name)
                where = "float value"
            details.append({"op": name, "channels": int(error.size), "mean_abs_correction": float(np.abs(error).mean()),
                            "max_abs_correction": float(np.abs(error).max()),
                            "mean_abs_bias": float(np.abs(bias.value).mean()), "stored": where})
        checked = {}
        if check:
            error_after = output_error(executor, *check)
            kept = error_after < error_before
            if not kept:
                _undo(graph, configs_before, float_values, created_biases)
                details, created, float_biases = [], 0, []
            checked = {"error_before": round(error_before, 6), "error_after": round(error_after, 6),
                       "kept": kept, "checked_samples": int(sum(sample_count(b) for b in check[0]))}
        return {**checked, "corrected": len(details), "scope": self.scope, "biases_created": created, "new_bias": new_bias, "batches": batches,
                "samples": samples,
                "budget_spent": budget_spent,
                "float_biases_changed": float_biases,
                "mean_abs_correction": float(np.mean([d["mean_abs_correction"] for d in details])) if details else 0.0,
                "skipped": len(skipped), "ops": details, "skipped_ops": skipped}
