"""Graph IR: variables (tensors), operations and the graph that links them.

A :class:`Variable` is an edge of the dataflow graph: produced by at most one
operation and read by any number.  A parameter is a variable with a constant
``value`` and no producer.  An :class:`Operation` is a node: an ONNX op type
with attributes, ordered input and output variables, the platform the
dispatcher chose for it and a slot for its quantization config.

Optional ONNX inputs that are left out (an empty name in ONNX) are ``None`` in
``Operation.inputs``.  If, Loop and Scan hold their bodies as Graphs in their attributes, and list
the values their bodies read from the enclosing scope after their ONNX inputs
(:mod:`ppqlike.core.subgraphs`).

The :class:`Graph` keeps producer/consumer links consistent through its
editing API; code outside this module should edit graphs only through it.
Graph algorithms (topological order, reachability, pattern search) come from
networkx, through :class:`ppqlike.core.graph_algorithms.GraphAlgorithms`; renaming from
:class:`~ppqlike.core.graph_renames.GraphRenames`, pickling from :class:`~ppqlike.core.graph_tables.GraphTables`.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .errors import GraphError
from .graph_algorithms import GraphAlgorithms
from .graph_renames import GraphRenames
from .graph_tables import GraphTables
from .graph_links import check_links
from .subgraphs import explicit_input_count, has_bodies, rebind_implicit_input

Shape = list  # list of int | str | None: str and None are dynamic dimensions


class Variable:
    """A tensor of the graph.

    ``value`` is set for parameters (initializers and folded constants) and is
    ``None`` for activations.  ``producer`` is the operation that writes it
    (``None`` for graph inputs and parameters); ``consumers`` lists every
    operation that reads it, once per reading input slot.
    """

    __slots__ = ("name", "value", "shape", "dtype", "producer", "consumers")

    def __init__(self, name: str, value: np.ndarray | None = None,
                 shape: Sequence[Any] | None = None, dtype: Any = None):
        self.name = name
        self.value = None if value is None else np.asarray(value)
        if self.value is not None:
            shape = list(self.value.shape) if shape is None else shape
            dtype = self.value.dtype if dtype is None else dtype
        self.shape: Shape | None = None if shape is None else list(shape)
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.producer: Operation | None = None
        self.consumers: list[Operation] = []

    @property
    def is_parameter(self) -> bool:
        """True for constants: the variable holds a value and nothing produces it."""
        return self.value is not None and self.producer is None

    def __repr__(self) -> str:
        kind = "param" if self.is_parameter else "var"
        return f"<{kind} {self.name} shape={self.shape} dtype={self.dtype}>"


class Operation:
    """A node of the graph: one ONNX operation.

    ``platform`` is written by the dispatcher (TARGET, FP32 or SOI); ``config``
    holds the OperationQuantizationConfig written by a platform quantizer.
    """

    __slots__ = ("name", "type", "attributes", "inputs", "outputs", "domain",
                 "platform", "config")

    def __init__(self, name: str, op_type: str, attributes: dict | None = None,
                 domain: str = ""):
        self.name = name
        self.type = op_type
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.inputs: list[Variable | None] = []
        self.outputs: list[Variable] = []
        self.domain = domain
        self.platform: Any = None
        self.config: Any = None

    @property
    def parameters(self) -> list[Variable]:
        """Inputs that are constants (weights, biases, shape constants)."""
        return [v for v in self.inputs if v is not None and v.is_parameter]

    @property
    def activations(self) -> list[Variable]:
        """Inputs that are computed at run time."""
        return [v for v in self.inputs if v is not None and not v.is_parameter]

    def __repr__(self) -> str:
        ins = ", ".join("" if v is None else v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"<{self.type} {self.name} ({ins}) -> ({outs})>"


class VariableList(list):
    """The graph's inputs or outputs, in order: a list of Variables that also answers PPQ's dict reads
    (``graph.inputs.items()``, ``.keys()``, ``.values()``, ``graph.inputs[name]``), where PPQ's graph
    holds name -> Variable."""

    def keys(self) -> list[str]:
        return [variable.name for variable in self]

    def values(self) -> list["Variable"]:
        return list(self)

    def items(self) -> list[tuple[str, "Variable"]]:
        return [(variable.name, variable) for variable in self]

    def __getitem__(self, key):
        if isinstance(key, str):
            for variable in self:
                if variable.name == key:
                    return variable
            raise KeyError(key)
        return super().__getitem__(key)


class Graph(GraphAlgorithms, GraphRenames, GraphTables):
    """A dataflow graph of operations and variables, with a consistent editing API.

    ``inputs`` and ``outputs`` are the graph's inputs and outputs in order;
    ``opset`` is the default-domain opset the graph was written for.
    """

    is_ir_graph = True   # how an op's attributes tell a body (``core.subgraphs``) from other values

    def __init__(self, name: str = "graph", opset: int = 13):
        self.name = name
        self.opset = opset
        self.operations: dict[str, Operation] = {}
        self.variables: dict[str, Variable] = {}
        self.inputs = VariableList()
        self.outputs = VariableList()
        self.metadata: dict[str, Any] = {}
        self.revision = 0  # bumped by every structural edit; executors recompile when it changes

    @property
    def inputs(self) -> VariableList:
        return self._inputs

    @inputs.setter
    def inputs(self, variables) -> None:
        self._inputs = VariableList(variables)

    @property
    def outputs(self) -> VariableList:
        return self._outputs

    @outputs.setter
    def outputs(self, variables) -> None:
        self._outputs = VariableList(variables)

    # ------------------------------------------------------------ naming --
    def unique_name(self, prefix: str) -> str:
        """A name not yet used by any variable or operation."""
        if prefix not in self.variables and prefix not in self.operations:
            return prefix
        index = 1
        while f"{prefix}_{index}" in self.variables or f"{prefix}_{index}" in self.operations:
            index += 1
        return f"{prefix}_{index}"

    # ---------------------------------------------------------- creation --
    def create_variable(self, name: str | None = None, value: np.ndarray | None = None,
                        shape: Sequence[Any] | None = None, dtype: Any = None) -> Variable:
        """Add a new variable (a parameter when ``value`` is given)."""
        self.revision += 1
        name = self.unique_name("var") if name is None else name
        if name in self.variables:
            raise GraphError(f"graph {self.name!r}: a variable named {name!r} already exists")
        variable = Variable(name, value=value, shape=shape, dtype=dtype)
        self.variables[name] = variable
        return variable

    def create_operation(self, op_type: str, inputs: Sequence[Variable | None] = (),
                         outputs: Sequence[Variable] = (), attributes: dict | None = None,
                         name: str | None = None, domain: str = "") -> Operation:
        """Add a new operation reading ``inputs`` and writing ``outputs``.

        Variables must already belong to the graph; an output must not have a
        producer yet.
        """
        self.revision += 1
        name = self.unique_name(op_type.lower()) if name is None else name
        if name in self.operations:
            raise GraphError(f"graph {self.name!r}: an operation named {name!r} already exists")
        operation = Operation(name, op_type, attributes, domain)
        for variable in list(inputs) + list(outputs):
            if variable is not None and self.variables.get(variable.name) is not variable:
                raise GraphError(f"operation {name!r}: variable {variable.name!r} is not part of graph {self.name!r}")
        for variable in outputs:
            if variable.producer is not None:
                raise GraphError(f"operation {name!r}: variable {variable.name!r} is already "
                                 f"produced by {variable.producer.name!r}")
            if variable.value is not None or variable in self.inputs:
                kind = "a parameter" if variable.value is not None else "a graph input"
                raise GraphError(f"operation {name!r}: output {variable.name!r} is {kind}; "
                                 "an op cannot write it")
        if len({id(v) for v in outputs}) != len(outputs):
            raise GraphError(f"operation {name!r}: the same variable appears twice among its outputs")
        self.operations[name] = operation
        for variable in inputs:
            operation.inputs.append(variable)
            if variable is not None:
                variable.consumers.append(operation)
        for variable in outputs:
            operation.outputs.append(variable)
            variable.producer = operation
        return operation

    # ----------------------------------------------------------- removal --
    def remove_operation(self, operation: Operation, remove_unused_outputs: bool = True) -> None:
        """Remove ``operation``, unlinking it from its inputs and outputs.

        Its outputs lose their producer; with ``remove_unused_outputs`` an
        output nothing reads (and that is no graph output) is removed too, and
        so is a parameter input that no other operation reads.
        """
        self.revision += 1
        self._own_operation(operation)
        for variable in operation.inputs:
            if variable is not None:
                variable.consumers.remove(operation)
                if (remove_unused_outputs and variable.is_parameter and not variable.consumers
                        and variable not in self.outputs and variable not in self.inputs):
                    del self.variables[variable.name]
        for variable in operation.outputs:
            variable.producer = None
            if remove_unused_outputs and not variable.consumers and variable not in self.outputs:
                del self.variables[variable.name]
        operation.inputs, operation.outputs = [], []
        del self.operations[operation.name]

    def remove_variable(self, variable: Variable) -> None:
        """Remove a variable that nothing produces or reads any more."""
        self.revision += 1
        self._own_variable(variable)
        if variable.producer is not None or variable.consumers:
            users = [op.name for op in variable.consumers]
            if variable.producer is not None:
                users.append(variable.producer.name)
            raise GraphError(f"cannot remove variable {variable.name!r}: still linked to {users}")
        self.variables.pop(variable.name)
        if variable in self.inputs:
            self.inputs.remove(variable)
        if variable in self.outputs:
            self.outputs.remove(variable)

    def bypass_operation(self, operation: Operation) -> bool:
        """Remove a pass-through op (Identity, Dropout) whose first output equals its first input.

        Its consumers read its input instead.  When its output is a graph
        output, the input is renamed to the output's name so that the graph's
        interface is unchanged; when that is impossible (the input is itself a
        graph input, graph output or parameter) the op is kept and False is
        returned.
        """
        self._own_operation(operation)
        source, target = operation.inputs[0], operation.outputs[0]
        if source is None:
            raise GraphError(f"cannot bypass {operation.name!r}: its first input is missing")
        if any(v.consumers or v in self.outputs for v in operation.outputs[1:]):
            return False  # e.g. a Dropout mask that something reads
        if target in self.outputs and (source.producer is None or source in self.outputs):
            return False
        target_is_output = target in self.outputs
        outputs = list(operation.outputs)
        self.remove_operation(operation, remove_unused_outputs=False)
        self.replace_variable(target, source)
        for variable in outputs:
            del self.variables[variable.name]
        if target_is_output:  # source took the place of target: keep the interface name and type
            self.rename_variable(source, target.name)
            source.shape = target.shape if source.shape is None else source.shape
            source.dtype = target.dtype if source.dtype is None else source.dtype
        return True

    # ----------------------------------------------------------- editing --
    def replace_variable(self, old: Variable, new: Variable) -> None:
        """Make every consumer of ``old`` read ``new`` instead (graph outputs too)."""
        self.revision += 1
        self._own_variable(old)
        self._own_variable(new)
        if old is new:
            return
        for operation in list(dict.fromkeys(old.consumers)):
            for index, variable in enumerate(operation.inputs):
                if variable is old:
                    operation.inputs[index] = new
                    new.consumers.append(operation)
            if operation.attributes and has_bodies(operation):  # a body reads it by name: follow
                rebind_implicit_input(operation, old.name, new.name)
        old.consumers = []
        self.outputs = [new if v is old else v for v in self.outputs]

    def replace_input(self, operation: Operation, index: int, new: Variable | None) -> None:
        """Make input slot ``index`` of ``operation`` read ``new``.

        An ``index`` past the last slot adds slots (omitted ones in between are
        ``None``): that is how an optional input such as a Conv bias is added.
        """
        self.revision += 1
        self._own_operation(operation)
        if new is not None:
            self._own_variable(new)
        if index >= len(operation.inputs):
            operation.inputs.extend([None] * (index + 1 - len(operation.inputs)))
        old = operation.inputs[index]
        if old is not None:
            old.consumers.remove(operation)
        operation.inputs[index] = new
        if new is not None:
            new.consumers.append(operation)
        if old is not None and new is not None and operation.attributes and has_bodies(operation) \
                and index >= explicit_input_count(operation):   # a body reads it by name: follow
            rebind_implicit_input(operation, old.name, new.name)

    def insert_operation_on_variable(self, variable: Variable, op_type: str,
                                     consumers: Iterable[Operation] | None = None,
                                     attributes: dict | None = None, name: str | None = None,
                                     extra_inputs: Sequence[Variable] = ()) -> Operation:
        """Insert a new op between ``variable`` and (some of) its consumers.

        The new op reads ``variable`` (then ``extra_inputs``) and writes a new
        variable that the chosen consumers (all by default) read instead.  If
        ``variable`` is a graph output and all consumers are redirected, the
        graph output becomes the new variable.
        """
        self._own_variable(variable)
        targets = list(dict.fromkeys(variable.consumers if consumers is None else consumers))
        for consumer in targets:
            if consumer not in variable.consumers:
                raise GraphError(f"{consumer.name!r} does not read {variable.name!r}")
        output = self.create_variable(self.unique_name(f"{variable.name}_{op_type.lower()}"),
                                      shape=variable.shape, dtype=variable.dtype)
        operation = self.create_operation(op_type, [variable, *extra_inputs], [output],
                                          attributes=attributes, name=name)
        for consumer in targets:
            for index, current in enumerate(consumer.inputs):
                if current is variable:
                    self.replace_input(consumer, index, output)
        if consumers is None and variable in self.outputs:
            self.outputs = [output if v is variable else v for v in self.outputs]
        return operation

    # ---------------------------------------------------------- checking --
    def check(self) -> None:
        """Raise GraphError if any producer/consumer link is inconsistent (:func:`check_links`)."""
        check_links(self)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.topological_sort())

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.operations)} ops, {len(self.variables)} variables>"

    # ----------------------------------------------------------- helpers --
    def _own_operation(self, operation: Operation) -> None:
        if self.operations.get(operation.name) is not operation:
            raise GraphError(f"operation {operation.name!r} is not part of graph {self.name!r}")

    def _own_variable(self, variable: Variable) -> None:
        if self.variables.get(variable.name) is not variable:
            raise GraphError(f"variable {variable.name!r} is not part of graph {self.name!r}")

