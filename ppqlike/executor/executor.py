"""NumpyExecutor: runs a Graph on numpy arrays, with hooks around every op.

The execution plan (``ppqlike.executor.plan``: topological order, one compiled
kernel per op, when each intermediate can be freed, what runs merged) is built
once per graph revision and set of requested outputs.  Parameters are read
from ``Variable.value`` at run time, so passes that change weights need no
recompilation.

Quantization simulation: when an op carries an OperationQuantizationConfig,
the inputs and outputs whose configs are in an applied state are
fake-quantized around the kernel (see ``ppqlike.executor.simulation``); ops
marked for the deployment runtime's integer kernels are computed as those
kernels compute them (``ppqlike.executor.onnxruntime_kernels``), and ops that
requantize by an integer multiplier and shift (TPU style) on integer codes
(``ppqlike.executor.requantizing_kernels``).  Without hooks,
a Relu/Clip runs inside or in place on its producer's result, a zero Pad
is done by the Convs reading it (``ppqlike.executor.fusion``), and a
MobileNet expansion runs with the depthwise Conv reading it as one kernel,
in float or on integer codes (``ppqlike.executor.chains``); a float conv
kernel clips and fake-quantizes its result block by block
(``fusion.quantizing_epilogue``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.errors import ExecutionError, PPQLikeError
from ..core.ir import Graph, Operation
from ..core.subgraphs import captures
from .fusion import (MOVES_CODES, READS_SHAPE_ONLY, activate_in_place, activate_on_grid, activation_bounds,
                     clip_epilogue, configs_let_fuse, fusable, grid_edges, moves_grid, quantizing_epilogue,
                     requantizes_onto, run_on_codes)
from .chains import output_grid, run_float_chain, run_integer_chain
from .inputs import named_inputs
from .integer_codes import Codes, values_hold_codes, values_of
from .memory import keep_freed_memory
from .onnxruntime_kernels import run_runtime_kernel, wants_runtime_kernel
from .quantized_sum import quantized_sum
from .requantizing_kernels import run_requantizing_kernel, wants_integer_kernel
from .ops import Kernel, build_kernel
from .ops._threads import computing_threads
from .ops.control_flow import RUNNING
from .hooks import OperationHook, after_hooks, running as _running
from .ops.tensor import zero_spatial_pads
from .plan import Plan, Step, build_plan, release_values, store_results
from .simulation import (argument_grids, fresh_results, keeps_grid, passes_through, quantize_inputs,
                         quantize_outputs)


class NumpyExecutor:
    """Runs ``graph`` with numpy.

    >>> executor = NumpyExecutor(graph)
    >>> logits, = executor.forward({"input": images})
    """

    def __init__(self, graph: Graph, runtime_kernels: bool = True, body: bool = False):
        self.graph = graph
        #: False: ops marked for the deployment runtime's integer kernels run their float kernel
        #: instead (the QDQ semantics of the ONNX spec, as onnxruntime runs it unoptimized).
        self.runtime_kernels = runtime_kernels
        #: True: ``graph`` is the body of an If/Loop/Scan, run by :meth:`run_body` with the values it reads
        #: from the enclosing scope.
        self.body = body
        self._kernels: dict[str, tuple[int, Kernel]] = {}
        self._plans: dict[tuple, Plan] = {}
        self._plan_revision = -1
        keep_freed_memory()   # the next batch reuses this one's freed memory instead of re-faulting it
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
    def compile(self, output_names: Sequence[str] | None = None) -> Plan:
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
            outer = frozenset(v.name for v in captures(graph)) if self.body else frozenset()
            plan = self._plans[key] = build_plan(graph, names, self._kernel, outer)
        return plan

    def _kernel(self, operation: Operation) -> Kernel:
        cached = self._kernels.get(operation.name)
        if cached is not None and cached[0] == id(operation):
            return cached[1]
        kernel = build_kernel(operation, self.graph.opset)
        self._kernels[operation.name] = (id(operation), kernel)
        return kernel

    # ---------------------------------------------------------- execution --
    def prepare_inputs(self, inputs: Any) -> dict[str, np.ndarray]:
        """Turn ``inputs`` (a mapping, a list in graph-input order, or one array) into named arrays
        (``inputs.named_inputs``: declared dtypes, checked ranks and shapes)."""
        return named_inputs(self.graph, inputs)

    def forward(self, inputs: Any, output_names: Sequence[str] | None = None,
                hooks: Sequence[OperationHook] = ()) -> list[np.ndarray]:
        """Run the graph and return the requested outputs (graph outputs by default), in order (BLAS
        single-threaded meanwhile, the parallel work on the kernel threads: ``ops._threads``)."""
        with computing_threads(), _running(self, hooks):
            return self._forward(inputs, output_names, hooks)

    def run_body(self, values: dict) -> list:
        """Run the graph as a body (``body=True``): ``values`` holds its inputs and the values it reads from
        the enclosing scope, by name, as they are; the hooks of the forward running it that reach bodies
        see its ops.  Returns its outputs in order."""
        running = RUNNING.get()
        return self._forward(values, None, running[0] if running else (), given=True)

    def _forward(self, inputs: Any, output_names: Sequence[str] | None,
                 hooks: Sequence[OperationHook], given: bool = False) -> list[np.ndarray]:
        plan = self.compile(output_names)
        names = tuple(v.name for v in self.graph.outputs) if output_names is None else tuple(output_names)
        values: dict[str, Any] = dict(inputs) if given else self.prepare_inputs(inputs)
        for name in plan.needed_inputs:
            if name not in values:
                raise ExecutionError(f"graph {self.graph.name!r}: input {name!r} was not given")
        fused_into: dict[int, object] = {}  # activation step index -> producer's pre-activation result
        deferred_pads: dict[str, list] = {}  # output of a folded Pad (its input as it is) -> the pads it owes
        grids: dict[str, tuple] = {}  # value name -> grid key of the config that last quantized it
        for index, step in enumerate(plan.steps):
            operation = step.operation
            if index in fused_into:  # this activation already ran in place on its producer's result
                release_values(step, values)
                continue
            if not hooks and operation.type in MOVES_CODES and values_hold_codes(step.inputs, values):
                moved = run_on_codes(operation, step.kernel, step.inputs, values, grids,
                                     lambda name: self._argument(name, values))
                if moved is not None:   # codes in, codes out: nothing turned into values
                    for name, value in zip(step.outputs, moved):
                        values[name], grids[name] = value, grids[step.inputs[0]]
                    release_values(step, values)
                    continue
            runtime = self.runtime_kernels and wants_integer_kernel(operation)
            arguments = self._arguments(step, values, grids, keep_codes=runtime and not hooks)
            if index in plan.pad_folds and not hooks:
                extra = zero_spatial_pads(arguments)
                if extra is not None:   # the Convs reading it pad instead
                    values[step.outputs[0]] = arguments[0]
                    deferred_pads[step.outputs[0]] = extra
                    release_values(step, values)
                    continue
            if index in plan.chains and not hooks \
                    and self._run_chain(plan, index, arguments, values, grids, fused_into, runtime):
                release_values(step, values)
                continue
            summed = None if hooks or runtime or operation.type != "Add" else \
                quantized_sum(operation, arguments, step.inputs, grids)
            if summed is not None:   # a residual Add, its quantizations inside, block by block
                store_results(step.outputs, [summed[0]], summed[1], values, grids)
                release_values(step, values)
                continue
            extra_pads = deferred_pads.get(step.inputs[0]) if deferred_pads and step.inputs else None
            arguments = quantize_inputs(operation, arguments, step.inputs, grids, as_codes=runtime and not hooks)
            grids_of_arguments = argument_grids(operation, step.inputs, grids) if runtime else ()
            for hook in hooks:
                replaced = hook.before_operation(operation, arguments)
                if replaced is not None:
                    arguments, grids_of_arguments = list(replaced), ()  # a hook's values may lie anywhere
            partner = plan.fusions.get(index)
            if partner is not None and hooks and not all(
                    hook.lets_fuse(operation, plan.steps[partner].operation) for hook in hooks):
                partner = None   # a hook reads a value the fused kernel never makes
            fuses, bounds, clip, edges, inside = self._fusion(plan, step, partner, arguments, values, runtime,
                                                              hooks)
            try:
                results, on_output_grid = self._run_kernel(operation, step.kernel, arguments, grids_of_arguments,
                                                           clip, extra_pads, edges, as_codes=not hooks)
            except PPQLikeError:
                raise
            except Exception as error:  # a numpy error inside a kernel: name the node
                shapes = [None if a is None else [list(np.shape(x)) for x in a] if isinstance(a, list)
                          else list(np.shape(a)) for a in arguments]   # (a sequence: its tensors' shapes)
                raise ExecutionError(f"{operation.type} node {operation.name!r} failed on input shapes "
                                     f"{shapes}: {type(error).__name__}: {error}") from error
            if inside is not None:   # clipped and quantized block by block in the kernel
                if fuses:
                    fused_into[partner] = True
                store_results(plan.steps[partner].outputs if fuses else step.outputs, results, inside[0], values, grids)
                if partner is not None and not fuses \
                        and self._activate_on_grid(plan.steps[partner], step, results, values, grids):
                    fused_into[partner] = True
                release_values(step, values)
                continue
            on_edges = on_output_grid and edges is not None   # the integer kernel did the activation
            if partner is not None and not on_edges:
                results = [values_of(value) for value in results]
            if clip is not None or on_edges or (partner is not None
                                                and fusable(operation, plan.steps[partner].operation, results[0])):
                activation = plan.steps[partner]
                lies_on = output_grid(operation) if on_output_grid else None   # where the integer kernel put it
                results = activate_in_place(activation.operation, activation.outputs, results[0], bounds, grids,
                                            lies_on, clipped=clip is not None, on_edges=on_edges)
                fused_into[partner] = True   # (the hooks let it fuse: they read the activation's outputs at most)
                results = after_hooks(hooks, activation.operation, [], results, activation.outputs, grids)
                for name, value in zip(activation.outputs, results):
                    values[name] = value
                release_values(step, values)
                continue
            on_output_grid = on_output_grid or (not hooks and moves_grid(operation, step.inputs, grids))
            results = quantize_outputs(operation, results, step.outputs, grids, on_output_grid,
                                       fresh_results(operation, results, arguments))
            if partner is not None and not fuses and not runtime and not hooks \
                    and self._activate_on_grid(plan.steps[partner], step, results, values, grids):
                fused_into[partner] = True   # the quantized result, which the activation clips to grid edges
                release_values(step, values)
                continue
            results = after_hooks(hooks, operation, arguments, results, step.outputs, grids)
            for name, value in zip(step.outputs, results):
                values[name] = value
            release_values(step, values)
        outputs = []
        for name in names:
            value = self._argument(name, values)
            if isinstance(value, list):   # a sequence (``ops.sequence``)
                outputs.append([np.array(item) for item in value])
                continue
            value = np.asarray(value)
            if not value.flags.writeable or value.base is not None:
                value = value.copy()  # never hand out a view of a parameter or a read-only broadcast
            outputs.append(value)
        return outputs

    __call__ = forward

    def _run_chain(self, plan: Plan, index: int, arguments: list, values: dict, grids: dict,
                   fused_into: dict, runtime: bool) -> bool:
        """Run the 1x1 Conv of step ``index`` and the depthwise Conv of its chain (``fusion.expand_chains``)
        as one kernel, their Relu/Clips inside (``chains``; on integer codes when ``runtime``: the
        integer kernels run); False (nothing done) when it does not apply."""
        chain = plan.chains[index]
        first_activation, pad, second, second_activation = chain
        later = [step for step in (second, pad) + plan.projections.get(index, ()) if step is not None]
        if any(name is not None and name not in values and self.graph.variables[name].value is None
               for step in later for name in plan.steps[step].inputs[1:]):
            return False   # an input not computed yet
        argument = lambda name: self._argument(name, values)   # noqa: E731
        runner = run_integer_chain if runtime else run_float_chain
        result = runner(chain, plan.steps, index, arguments, argument, grids, self.graph.opset,
                        plan.projections.get(index))
        if result is None:
            return False
        out, key, projected = result
        projection, projection_activation = plan.projections[index] if projected else (None, None)
        last = plan.steps[projection_activation if projection_activation is not None else
                          projection if projection is not None else
                          second if second_activation is None else second_activation].outputs[0]
        values[last] = out
        if key is not None:
            grids[last] = key
        for skipped in (first_activation, pad, second, second_activation, projection, projection_activation):
            if skipped is not None:
                fused_into[skipped] = True
        return True

    def _fusion(self, plan: Plan, step: Step, partner: int | None, arguments: list, values: dict,
                runtime: bool, hooks) -> tuple:
        """What the kernel of ``step`` does besides its op: (whether the Relu/Clip of step ``partner`` fuses
        into it, that activation's bounds, the epilogue a float conv kernel applies to each block of its
        result - the activation's clip, and without hooks the output quantization (``quantizing_epilogue``)
        -, the grid edges an integer kernel clamps to, and (the grid key,) when the epilogue quantizes)."""
        operation = step.operation
        fuses = partner is not None and (configs_let_fuse(operation, plan.steps[partner].operation) or (
            runtime and requantizes_onto(operation, plan.steps[partner].operation)))
        bounds = clip = edges = inside = None
        takes_epilogue = getattr(step.kernel, "takes_epilogue", False)
        if fuses:
            activation = plan.steps[partner]
            bounds = activation_bounds(activation.operation, self._bound_inputs(activation, values), self.graph.opset)
            if runtime:
                edges = grid_edges(activation.operation, bounds, output_grid(operation))
        if runtime or not takes_epilogue:
            return fuses, bounds, clip, edges, inside
        stage = None
        if not hooks and arguments and getattr(arguments[0], "dtype", None) == np.float32:
            stage = quantizing_epilogue(operation, plan.steps[partner].operation if fuses else None, bounds)
        if stage is not None and (fuses or stage[0] is not None):
            clip, inside = stage[0], stage[1:]
        elif fuses:
            clip = clip_epilogue(bounds)
        return fuses, bounds, clip, edges, inside

    def _activate_on_grid(self, activation: Step, step: Step, results: list, values: dict, grids: dict) -> bool:
        """Run ``activation``, the Relu/Clip that alone reads ``step``'s quantized result, in place on it by
        ``fusion.activate_on_grid``; False (nothing done) when that does not apply."""
        if len(results) != 1:
            return False
        bounds = activation_bounds(activation.operation, self._bound_inputs(activation, values), self.graph.opset)
        activated = activate_on_grid(activation.operation, activation.outputs, results[0], grids.get(step.outputs[0]),
                                     bounds, grids)
        if activated is None:
            return False
        store_results(activation.outputs, activated, grids.get(activation.outputs[0]), values, grids)
        return True

    def _argument(self, name: str | None, values: dict):
        """The value of a step's input ``name`` (None for an omitted one); ``Codes`` turned into values."""
        if name is None:
            return None
        if name not in values:
            return self.graph.variables[name].value
        value = values[name]
        if isinstance(value, Codes):
            value = values[name] = value.values()
        return value

    def _arguments(self, step: Step, values: dict, grids: dict, keep_codes: bool) -> list:
        """A step's input values; with ``keep_codes`` (an integer kernel reads them), the ``Codes`` that
        its input configs pass as they are (passing through, or on their grids) stay codes."""
        configs = step.operation.config.input_quantization_config if keep_codes and step.operation.config else ()
        arguments = []
        for index, name in enumerate(step.inputs):
            value = values.get(name) if name is not None else None
            if isinstance(value, Codes) and step.operation.type in READS_SHAPE_ONLY:
                arguments.append(value.values() if value.codes() is None else value.codes())   # its shape
            elif isinstance(value, Codes) and index < len(configs) and (
                    passes_through(configs[index]) or keeps_grid(configs[index], grids.get(name))):
                arguments.append(value)
            else:
                arguments.append(self._argument(name, values))
        return arguments

    def _bound_inputs(self, step: Step, values: dict) -> list:
        """The values of a step's inputs after the first (a Clip's bounds)."""
        return [self._argument(name, values) for name in step.inputs[1:]]

    def _run_kernel(self, operation: Operation, kernel: Kernel, arguments: list, argument_grids: tuple = (),
                    epilogue=None, extra_pads: list | None = None, edges=None,
                    as_codes: bool = False) -> tuple[list, bool]:
        """The op's raw results: its float kernel, or an integer kernel (onnxruntime's where marked, or the
        integer requantization); and whether they already lie on the output configs' grids (the integer
        kernels' do, requantized where a config requantizes).  ``epilogue``:
        in-place elementwise work for a float kernel that does it block by block (``takes_epilogue``):
        a fused activation's clip; ``extra_pads``: the padding a folded Pad left to this Conv; ``edges``:
        a fused activation's (``fusion.grid_edges``) the integer kernel clamps to; ``as_codes``: its
        results may be ``Codes``.  ``Codes`` among the arguments are read by the integer kernel only."""
        if self.runtime_kernels and wants_integer_kernel(operation):
            run = run_runtime_kernel if wants_runtime_kernel(operation) else run_requantizing_kernel
            results = run(operation, kernel, arguments, argument_grids, edges, as_codes)
            if results is not None:
                return results, True
            arguments = [values_of(value) for value in arguments]
        if epilogue is None and extra_pads is None:
            return kernel(arguments), False
        return kernel(arguments, epilogue=epilogue, extra_pads=extra_pads), False

    def run_operation(self, operation: Operation, inputs: list, quantized: bool = True) -> list:
        """Run one op on given input arrays (through its configs when ``quantized``)."""
        with _running(self, ()):
            return self._run_operation(operation, inputs, quantized)

    def _run_operation(self, operation: Operation, inputs: list, quantized: bool) -> list:
        kernel = self._kernel(operation)
        if quantized:
            arguments = quantize_inputs(operation, list(inputs))
            results, on_output_grid = self._run_kernel(operation, kernel, arguments)
            return quantize_outputs(operation, results, on_output_grid=on_output_grid)
        return list(kernel(list(inputs)))
