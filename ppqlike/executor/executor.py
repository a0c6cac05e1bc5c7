"""NumpyExecutor: runs a Graph on numpy arrays, with hooks around every op.

The execution plan (topological order, one compiled kernel per op, and when
each intermediate can be freed) is compiled once per graph revision and set of
requested outputs.  Parameters are read from ``Variable.value`` at run time,
so passes that change weights need no recompilation.

Quantization simulation: when an op carries an OperationQuantizationConfig,
the inputs and outputs whose configs are in an applied state are
fake-quantized around the kernel (see ``ppqlike.executor.simulation``); ops
marked for the deployment runtime's integer kernels are computed as those
kernels compute them (``ppqlike.executor.onnxruntime_kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.errors import ExecutionError, PPQLikeError
from ..core.ir import Graph, Operation
from ..core.op_facts import COMPUTING_TYPES, FUSABLE_ACTIVATIONS
from ..core.quant_graph import overlapped_root
from .ops import Kernel, build_kernel
from .ops.tensor import zero_spatial_pads
from .onnxruntime_kernels import run_runtime_kernel, wants_runtime_kernel
from .simulation import (apply_config, apply_output_config, argument_grids, fresh_results, grid_key,
                         keeps_grid, passes_through)


class OperationHook:
    """Called around every op.  Subclass and override what you need.

    ``before_operation`` sees the op's input arrays (after input quantization)
    and ``after_operation`` its output arrays (after output quantization).
    Returning a list replaces the values; returning None keeps them.
    """

    def before_operation(self, operation: Operation, inputs: list) -> list | None:
        return None

    def after_operation(self, operation: Operation, inputs: list, outputs: list) -> list | None:
        return None


@dataclass
class _Step:
    operation: Operation
    kernel: Kernel
    inputs: tuple          # variable names (None for omitted inputs)
    outputs: tuple         # variable names
    release: tuple         # names whose last reader is this step


@dataclass
class _Plan:
    steps: list
    needed_inputs: tuple
    fusions: dict = field(default_factory=dict)   # step index of a Conv -> step index of its Relu/Clip
    pad_folds: frozenset = frozenset()  # step indices of Pads whose Convs can pad instead (see _build_plan)


class NumpyExecutor:
    """Runs ``graph`` with numpy.

    >>> executor = NumpyExecutor(graph)
    >>> logits, = executor.forward({"input": images})
    """

    def __init__(self, graph: Graph, runtime_kernels: bool = True):
        self.graph = graph
        #: False: ops marked for the deployment runtime's integer kernels run their float kernel
        #: instead (the QDQ semantics of the ONNX spec, as onnxruntime runs it unoptimized).
        self.runtime_kernels = runtime_kernels
        self._kernels: dict[str, tuple[int, Kernel]] = {}
        self._plans: dict[tuple, _Plan] = {}
        self._plan_revision = -1
        self.compile()

    # ------------------------------------------------- PPQ's call shapes --
    def __call__(self, inputs: Any, output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """``executor(data)`` as in PPQ: :meth:`forward`."""
        return self.forward(inputs, output_names)

    def load_graph(self, graph: Graph) -> "NumpyExecutor":
        """Run ``graph`` from now on (PPQ's ``load_graph``); kernels and plans are rebuilt."""
        self.graph = graph
        self._kernels.clear()
        self._plans.clear()
        self._plan_revision = -1
        self.compile()
        return self

    def tracing_operation_meta(self, inputs: Any = None, output_names: Sequence[str] | None = None) -> None:
        """PPQ's shape tracing: here it only compiles the plan (shapes are known from the data when it runs)."""
        self.compile(output_names)

    # ----------------------------------------------------------- planning --
    def compile(self, output_names: Sequence[str] | None = None) -> _Plan:
        """Compile (or fetch) the plan computing ``output_names`` (graph outputs by default).

        Unknown ops and unsupported attributes raise here, before data runs.
        """
        graph = self.graph
        if graph.revision != self._plan_revision:
            self._plans.clear()
            self._plan_revision = graph.revision
        names = tuple(v.name for v in graph.outputs) if output_names is None else tuple(output_names)
        key = (names, tuple(v.name for v in graph.inputs))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._build_plan(names)
        return plan

    def _kernel(self, operation: Operation) -> Kernel:
        cached = self._kernels.get(operation.name)
        if cached is not None and cached[0] == id(operation):
            return cached[1]
        kernel = build_kernel(operation, self.graph.opset)
        self._kernels[operation.name] = (id(operation), kernel)
        return kernel

    def _build_plan(self, output_names: tuple) -> _Plan:
        graph = self.graph
        for name in output_names:
            if name not in graph.variables:
                raise ExecutionError(f"graph {graph.name!r} has no tensor named {name!r} to output")
        # Keep only the ops the requested outputs depend on.
        needed: set[str] = set()
        frontier = [graph.variables[n] for n in output_names]
        while frontier:
            variable = frontier.pop()
            producer = variable.producer
            if producer is None or producer.name in needed:
                continue
            needed.add(producer.name)
            frontier.extend(v for v in producer.inputs if v is not None)
        order = [op for op in graph.topological_sort() if op.name in needed]
        graph_inputs = {v.name for v in graph.inputs}
        last_use: dict[str, int] = {}
        for index, operation in enumerate(order):
            for variable in operation.inputs:
                if variable is None:
                    continue
                if variable.producer is None and not variable.is_parameter and variable.name not in graph_inputs:
                    raise ExecutionError(
                        f"graph {graph.name!r}: input {variable.name!r} of {operation.type} node "
                        f"{operation.name!r} is not produced by any node, nor a graph input or parameter")
                last_use[variable.name] = index
        keep = set(output_names)
        releases: dict[int, list] = {}
        for name, index in last_use.items():
            variable = graph.variables[name]
            if name not in keep and not variable.is_parameter:
                releases.setdefault(index, []).append(name)
        steps = [
            _Step(op, self._kernel(op),
                  tuple(None if v is None else v.name for v in op.inputs),
                  tuple(v.name for v in op.outputs), tuple(releases.get(i, ())))
            for i, op in enumerate(order)]
        needed_inputs = tuple(n for n in (v.name for v in graph.inputs)
                              if n in last_use or n in keep)
        position = {op.name: i for i, op in enumerate(order)}
        fusions = {}
        for index, operation in enumerate(order):
            if operation.type not in COMPUTING_TYPES or len(operation.outputs) != 1:
                continue
            output = operation.outputs[0]
            readers = output.consumers
            if len(readers) == 1 and readers[0].type in FUSABLE_ACTIVATIONS and output.name not in keep \
                    and readers[0].inputs[0] is output and readers[0].name in position:
                fusions[index] = position[readers[0].name]
        return _Plan(steps, needed_inputs, fusions, self._pad_folds(order, keep))

    def _pad_folds(self, order: list, keep: set) -> frozenset:
        """Indices of the constant Pads read only by unquantized Convs (as their data, with explicit pads):
        when such a Pad turns out at run time to pad with zeros on spatial axes only, its Convs pad
        instead (EfficientNet's exports pad before every "same" convolution: a copy of each input)."""
        if self.graph.opset < 11:
            return frozenset()
        folds = set()
        for index, operation in enumerate(order):
            if operation.type != "Pad" or operation.domain not in ("", "ai.onnx") or operation.config is not None \
                    or operation.attributes.get("mode", "constant") not in ("constant", b"constant"):
                continue
            output = operation.outputs[0]
            readers = output.consumers
            if output.name in keep or not readers or any(
                    r.type != "Conv" or r.config is not None or r.inputs[0] is not output
                    or any(v is output for v in r.inputs[1:])
                    or r.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID")
                    for r in readers):
                continue
            folds.add(index)
        return frozenset(folds)

    # ---------------------------------------------------------- execution --
    def prepare_inputs(self, inputs: Any) -> dict[str, np.ndarray]:
        """Turn ``inputs`` (a mapping, a list in graph-input order, or one array) into named arrays.

        Arrays are converted to each input's declared dtype; a missing input or
        a rank that differs from the declared one is an ExecutionError.
        """
        graph = self.graph
        if isinstance(inputs, Mapping):
            named = dict(inputs)
        elif isinstance(inputs, np.ndarray) or np.isscalar(inputs):
            if len(graph.inputs) != 1:
                raise ExecutionError(
                    f"graph {graph.name!r} has {len(graph.inputs)} inputs "
                    f"({[v.name for v in graph.inputs]}); pass a dict of name -> array")
            named = {graph.inputs[0].name: inputs}
        else:
            arrays = list(inputs)
            if len(arrays) != len(graph.inputs):
                raise ExecutionError(f"graph {graph.name!r} expects {len(graph.inputs)} inputs, got {len(arrays)}")
            named = {v.name: a for v, a in zip(graph.inputs, arrays)}
        unknown = set(named) - {v.name for v in graph.inputs}
        if unknown:
            raise ExecutionError(f"graph {graph.name!r} has no input named {sorted(unknown)}; "
                                 f"its inputs are {[v.name for v in graph.inputs]}")
        prepared = {}
        for variable in graph.inputs:
            if variable.name not in named:
                continue
            array = np.asarray(named[variable.name])
            if variable.dtype is not None and array.dtype != variable.dtype:
                array = array.astype(variable.dtype)
            if variable.shape is not None and array.ndim != len(variable.shape):
                raise ExecutionError(
                    f"input {variable.name!r} of graph {graph.name!r} must have rank {len(variable.shape)} "
                    f"(shape {variable.shape}), got an array of shape {list(array.shape)}")
            for declared, actual in zip(variable.shape or (), array.shape):
                if isinstance(declared, int) and declared > 0 and declared != actual:
                    raise ExecutionError(
                        f"input {variable.name!r} of graph {graph.name!r} must have shape {variable.shape}, "
                        f"got {list(array.shape)}")
            prepared[variable.name] = array
        return prepared

    def forward(self, inputs: Any, output_names: Sequence[str] | None = None,
                hooks: Sequence[OperationHook] = ()) -> list[np.ndarray]:
        """Run the graph and return the requested outputs (graph outputs by default), in order."""
        plan = self.compile(output_names)
        names = tuple(v.name for v in self.graph.outputs) if output_names is None else tuple(output_names)
        values: dict[str, Any] = self.prepare_inputs(inputs)
        for name in plan.needed_inputs:
            if name not in values:
                raise ExecutionError(f"graph {self.graph.name!r}: input {name!r} was not given")
        variables = self.graph.variables
        fused_into: dict[int, object] = {}  # activation step index -> producer's pre-activation result
        deferred_pads: dict[str, list] = {}  # output of a folded Pad (its input as it is) -> the pads it owes
        grids: dict[str, tuple] = {}  # value name -> grid key of the config that last quantized it
        for index, step in enumerate(plan.steps):
            operation = step.operation
            if index in fused_into:  # this activation already ran in place on its producer's result
                for name in step.release:
                    values.pop(name, None)
                continue
            arguments = []
            for name in step.inputs:
                if name is None:
                    arguments.append(None)
                elif name in values:
                    arguments.append(values[name])
                else:
                    arguments.append(variables[name].value)
            if index in plan.pad_folds and not hooks:
                extra = zero_spatial_pads(arguments)
                if extra is not None:   # the Convs reading it pad instead
                    values[step.outputs[0]] = arguments[0]
                    deferred_pads[step.outputs[0]] = extra
                    for name in step.release:
                        values.pop(name, None)
                    continue
            extra_pads = deferred_pads.get(step.inputs[0]) if deferred_pads and step.inputs else None
            arguments = self._quantize_inputs(operation, arguments, step.inputs, grids)
            runtime = self.runtime_kernels and wants_runtime_kernel(operation)   # only it reads the grids
            grids_of_arguments = argument_grids(operation, step.inputs, grids) if runtime else ()
            for hook in hooks:
                replaced = hook.before_operation(operation, arguments)
                if replaced is not None:
                    arguments, grids_of_arguments = list(replaced), ()  # a hook's values may lie anywhere
            partner = plan.fusions.get(index) if not hooks else None
            clip = None   # a fused Relu/Clip the conv kernel applies itself, block by block
            if partner is not None and not runtime and getattr(step.kernel, "fuses_clip", False) \
                    and self._configs_let_fuse(operation, plan.steps[partner].operation):
                clip = self._activation_bounds(plan.steps[partner], values, variables)
            try:
                results, on_output_grid = self._run_kernel(operation, step.kernel, arguments, grids_of_arguments,
                                                           clip, extra_pads)
            except PPQLikeError:
                raise
            except Exception as error:  # a numpy error inside a kernel: name the node
                shapes = [None if a is None else list(np.shape(a)) for a in arguments]
                raise ExecutionError(f"{operation.type} node {operation.name!r} failed on input shapes "
                                     f"{shapes}: {type(error).__name__}: {error}") from error
            if clip is not None or (partner is not None
                                    and self._fusable(operation, plan.steps[partner].operation, results[0])):
                activation = plan.steps[partner]
                lies_on = None   # the grid the integer kernel left the (unclamped) result on
                if on_output_grid and operation.config is not None:
                    lies_on = grid_key(overlapped_root(operation.config.output_quantization_config[0]))
                results = self._activate_in_place(activation, results[0], values, variables, grids, lies_on,
                                                  clipped=clip is not None)
                fused_into[partner] = True
                for name, value in zip(activation.outputs, results):
                    values[name] = value
                for name in step.release:
                    values.pop(name, None)
                continue
            results = self._quantize_outputs(operation, results, step.outputs, grids, on_output_grid,
                                             fresh_results(operation, results, arguments))
            for hook in hooks:
                replaced = hook.after_operation(operation, arguments, results)
                if replaced is not None:
                    results = list(replaced)
                    for name in step.outputs:  # a hook's values may lie anywhere
                        grids.pop(name, None)
            for name, value in zip(step.outputs, results):
                values[name] = value
            for name in step.release:
                values.pop(name, None)
        outputs = []
        for name in names:
            value = np.asarray(values[name] if name in values else variables[name].value)
            if not value.flags.writeable or value.base is not None:
                value = value.copy()  # never hand out a view of a parameter or a read-only broadcast
            outputs.append(value)
        return outputs

    __call__ = forward

    # ---------------------------------------------------- quant simulation --
    @classmethod
    def _fusable(cls, producer: Operation, activation: Operation, value) -> bool:
        """True when running ``activation`` in place on ``producer``'s raw result changes nothing observable."""
        if producer.type in ("Gemm", "MatMul") and not value.flags.owndata:
            return False
        if not isinstance(value, np.ndarray) or not value.flags.writeable or value.dtype.kind != "f":
            return False
        return cls._configs_let_fuse(producer, activation)

    @staticmethod
    def _configs_let_fuse(producer: Operation, activation: Operation) -> bool:
        """Whether no quantization stands between ``producer``'s result and ``activation``'s input."""
        between = []
        if producer.config is not None:
            between.append(producer.config.output_quantization_config[0]
                           if producer.config.output_quantization_config else None)
        if activation.config is not None:
            between.append(activation.config.input_quantization_config[0]
                           if activation.config.input_quantization_config else None)
        return all(c is None or (passes_through(c) and "requantization" not in c.detail) for c in between)

    def _activation_bounds(self, step: _Step, values: dict, variables: dict) -> tuple | None:
        """(low, high) of a Relu/Clip step (None for an absent bound), its bound inputs through its input
        configs; None when it bounds nothing."""
        activation = step.operation
        if activation.type == "Relu":
            return 0.0, None
        arguments = [None] + [None if n is None else (values[n] if n in values else variables[n].value)
                              for n in step.inputs[1:]]
        arguments = self._quantize_inputs(activation, arguments)
        low = None if len(arguments) < 2 or arguments[1] is None else arguments[1]
        high = None if len(arguments) < 3 or arguments[2] is None else arguments[2]
        if self.graph.opset < 11:
            low, high = activation.attributes.get("min"), activation.attributes.get("max")
        return None if low is None and high is None else (low, high)

    def _activate_in_place(self, step: _Step, value: np.ndarray, values: dict, variables: dict,
                           grids: dict, lies_on: tuple | None = None, clipped: bool = False) -> list:
        """Apply a Relu/Clip step to ``value`` in place (``clipped``: the producer's kernel did), then its
        output quantization.

        ``lies_on``: the grid key ``value`` lies on, unclamped (an integer kernel put it there).  When
        the activation's output config quantizes to that grid, quantize(clip(v, lo, hi)) equals
        clip(v, quantize(lo), quantize(hi)) for every v on it (quantization is monotone and leaves
        grid points in range unchanged), so one clip does both.
        """
        activation = step.operation
        bounds = None if clipped else self._activation_bounds(step, values, variables)
        low, high = bounds if bounds is not None else (None, None)
        output = activation.config.output_quantization_config[0] \
            if activation.config is not None and activation.config.output_quantization_config else None
        if lies_on is not None and output is not None and output.requantization is None \
                and keeps_grid(output, lies_on) and np.size(low) <= 1 and np.size(high) <= 1:
            bounds = output.fake_quantize(np.array([-np.inf if low is None else np.asarray(low).reshape(-1)[0],
                                                    np.inf if high is None else np.asarray(high).reshape(-1)[0]],
                                                   np.float32))
            np.clip(value, bounds[0], bounds[1], out=value)
            grids[step.outputs[0]] = lies_on
            return [value]
        if activation.type == "Relu" and not clipped:
            np.clip(value, 0, np.inf, out=value)   # numpy's two-bound clip: about 2x maximum's speed
        elif low is not None or high is not None:
            np.clip(value, low, high, out=value)
        return self._quantize_outputs(activation, [value], step.outputs, grids, fresh=(True,))

    @staticmethod
    def _quantize_inputs(operation: Operation, arguments: list, names: tuple = (), grids: dict | None = None
                         ) -> list:
        """The op's inputs through its input configs; a value whose name ``grids`` records on the grid a
        config would quantize it to is passed as it is (the same array: nothing would change)."""
        config = operation.config
        if config is None:
            return arguments
        quantized = list(arguments)
        for index, (tqc, value) in enumerate(zip(config.input_quantization_config, arguments)):
            name = names[index] if index < len(names) else None
            if grids and name in grids and keeps_grid(tqc, grids[name]):
                continue
            quantized[index] = apply_config(tqc, value)
        return quantized

    @staticmethod
    def _quantize_outputs(operation: Operation, results: list, names: tuple = (), grids: dict | None = None,
                          on_output_grid: bool = False, fresh: tuple = ()) -> list:
        """The op's results through its output configs, recording in ``grids`` (by ``names``) the grid each
        quantized one lies on; ``on_output_grid``: the results already lie on their configs' grids;
        ``fresh[i]``: result i is the executor's own and is quantized in place."""
        config = operation.config
        if config is None:
            return results
        quantized = list(results)
        for index, (tqc, value) in enumerate(zip(config.output_quantization_config, results)):
            key = grid_key(tqc)
            if not (on_output_grid and key is not None and tqc.requantization is None):
                in_place = index < len(fresh) and fresh[index]
                quantized[index] = apply_output_config(tqc, value, in_place)
            if grids is not None and index < len(names):
                if key is None:
                    grids.pop(names[index], None)
                else:
                    grids[names[index]] = key
        return quantized

    def _run_kernel(self, operation: Operation, kernel: Kernel, arguments: list, argument_grids: tuple = (),
                    clip: tuple | None = None, extra_pads: list | None = None) -> tuple[list, bool]:
        """The op's raw results: its float kernel, or the deployment runtime's integer kernel where marked;
        and whether they already lie on the output configs' grids (the integer kernel's do).  ``clip``:
        a fused activation's bounds, for a float kernel that applies them (``fuses_clip``); ``extra_pads``:
        the padding a folded Pad left to this Conv."""
        if self.runtime_kernels and wants_runtime_kernel(operation):
            results = run_runtime_kernel(operation, kernel, arguments, argument_grids)
            if results is not None:
                return results, True
        if clip is None and extra_pads is None:
            return kernel(arguments), False
        return kernel(arguments, clip=clip, extra_pads=extra_pads), False

    def run_operation(self, operation: Operation, inputs: list, quantized: bool = True) -> list:
        """Run one op on given input arrays (through its configs when ``quantized``)."""
        kernel = self._kernel(operation)
        if quantized:
            arguments = self._quantize_inputs(operation, list(inputs))
            results, on_output_grid = self._run_kernel(operation, kernel, arguments)
            return self._quantize_outputs(operation, results, on_output_grid=on_output_grid)
        return list(kernel(list(inputs)))
