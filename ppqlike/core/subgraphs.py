"""Subgraphs (bodies) of the control-flow ops If, Loop, Scan and SequenceMap.

A body is a :class:`~ppqlike.core.ir.Graph` of the same IR, held in the op's attributes
(``attributes["then_branch"]``, ``["else_branch"]`` of If, ``["body"]`` of Loop and Scan), with its
own ``inputs`` and ``outputs`` (Loop: iteration number, condition, loop-carried values in;
condition, carried values, scan outputs out; Scan: states and one slice of each scan input in;
SequenceMap: one element of each sequence input, or the whole tensor input, in).

A body may read values of the enclosing scope by name: those are its *captures*, variables of the
body that nothing in it produces, that are no parameter and no body input (:func:`captures`).  The
op that owns the body lists the enclosing graph's variables it captures after its ONNX inputs:
``op.inputs = [ONNX inputs ...] + [implicit inputs ...]`` (:func:`explicit_input_count`), so that
the enclosing graph's topological order, dead-code removal, constant folding and editing see them
as uses.  The body's capture variable and the op's implicit input share one name; the graph's
editing API keeps them so when the enclosing graph renames or replaces the value
(:func:`rebind_implicit_input`).  Constants of the enclosing scope a body reads are copied into
the body as its own parameters when the model is loaded (the array is shared, not copied).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from .errors import GraphError

if TYPE_CHECKING:  # the IR imports this module
    from .ir import Graph, Operation, Variable

#: Op type -> the attributes holding its bodies.
BODY_ATTRIBUTES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",),
                   "SequenceMap": ("body",)}
CONTROL_FLOW_TYPES = frozenset(BODY_ATTRIBUTES)


def is_graph(value) -> bool:
    """True for a body (a Graph of the IR, which says so: ``Graph.is_ir_graph``) held in an attribute."""
    return getattr(value, "is_ir_graph", False) is True


def bodies(operation: "Operation") -> list["Graph"]:
    """The op's bodies, in attribute order (empty for ops without subgraphs)."""
    return [value for value in operation.attributes.values() if is_graph(value)]


def named_bodies(operation: "Operation") -> list[tuple[str, "Graph"]]:
    """``(attribute name, body)`` of each of the op's bodies."""
    return [(key, value) for key, value in operation.attributes.items() if is_graph(value)]


def has_bodies(operation: "Operation") -> bool:
    return any(is_graph(value) for value in operation.attributes.values())


def explicit_input_count(operation: "Operation") -> int:
    """How many of ``operation.inputs`` are its ONNX inputs (the rest are implicit: values its bodies
    read from the enclosing scope).  If: the condition; Loop: max trip count, condition and one per
    carried value (as many as its body's inputs); Scan: states and scan inputs (as its body's);
    SequenceMap: the sequence and the additional inputs (one per body input)."""
    if not has_bodies(operation):
        return len(operation.inputs)
    if operation.type == "If":
        return 1
    body = operation.attributes.get("body")
    if operation.type in ("Loop", "Scan", "SequenceMap") and is_graph(body):
        return len(body.inputs)
    raise GraphError(f"{operation.type} node {operation.name!r} holds a subgraph, which ppqlike reads only "
                     f"for {sorted(BODY_ATTRIBUTES)}")


def implicit_inputs(operation: "Operation") -> list["Variable"]:
    """The enclosing graph's variables the op's bodies read."""
    return [v for v in operation.inputs[explicit_input_count(operation):] if v is not None]


def is_capture(body: "Graph", variable: "Variable") -> bool:
    """True for a variable ``body`` reads from an enclosing scope."""
    return variable.producer is None and variable.value is None and variable not in body.inputs


def captures(body: "Graph") -> list["Variable"]:
    """The variables ``body`` reads from enclosing scopes, in the body's order."""
    inputs = set(map(id, body.inputs))
    return [v for v in body.variables.values()
            if v.producer is None and v.value is None and id(v) not in inputs]


def captured_names(operation: "Operation") -> list[str]:
    """The names the op's bodies read from the enclosing scope, first seen first (each once)."""
    names: dict[str, None] = {}
    for body in bodies(operation):
        names.update(dict.fromkeys(v.name for v in captures(body)))
    return list(names)


def walk(graph: "Graph") -> Iterator[tuple["Graph", "Operation"]]:
    """Every ``(graph, op)`` of ``graph`` and, depth first after their op, of its bodies."""
    for operation in list(graph.operations.values()):
        yield graph, operation
        for body in bodies(operation):
            yield from walk(body)


def all_bodies(graph: "Graph") -> Iterator["Graph"]:
    """Every body nested in ``graph``, at any depth."""
    for _, operation in walk(graph):
        yield from bodies(operation)


def defined_names(graph: "Graph") -> set[str]:
    """Names ``graph`` itself defines (inputs, parameters, op outputs), not its captures."""
    return {name for name, v in graph.variables.items() if not is_capture(graph, v)}


# --------------------------------------------------- keeping names in sync
def rebind_implicit_input(operation: "Operation", old_name: str, new_name: str) -> None:
    """The enclosing graph made implicit input ``old_name`` of ``operation`` read the value named
    ``new_name``: rename the bodies' capture accordingly (merging with a capture of that name, and
    moving a body-local value of that name aside), then drop a repeated implicit input."""
    if old_name == new_name:
        return
    for body in bodies(operation):
        _rename_capture(body, old_name, new_name)
    _drop_repeated_implicit_inputs(operation)


def _rename_capture(body: "Graph", old_name: str, new_name: str) -> None:
    variable = body.variables.get(old_name)
    if variable is None or not is_capture(body, variable):
        return   # this body does not read it (another branch does)
    existing = body.variables.get(new_name)
    if existing is not None and is_capture(body, existing):
        body.replace_variable(variable, existing)   # both names now read one value
        body.remove_variable(variable)
        return
    if existing is not None:   # a body-local value of that name: it would shadow the outer one
        body.rename_variable(existing, body.unique_name(f"{new_name}_local"))
    body.rename_variable(variable, new_name)


def _drop_repeated_implicit_inputs(operation: "Operation") -> None:
    start = explicit_input_count(operation)
    seen: set[int] = set()
    kept = list(operation.inputs[:start])
    for variable in operation.inputs[start:]:
        if variable is None or id(variable) in seen:
            if variable is not None:
                variable.consumers.remove(operation)
            continue
        seen.add(id(variable))
        kept.append(variable)
    operation.inputs[:] = kept


def check_bodies(graph: "Graph") -> None:
    """GraphError unless every op's implicit inputs are exactly the names its bodies capture, and every
    body is consistent (``Graph.check``)."""
    for operation in graph.operations.values():
        if not has_bodies(operation):
            continue
        implicit = [v.name for v in implicit_inputs(operation)]
        wanted = captured_names(operation)
        if sorted(implicit) != sorted(wanted):
            raise GraphError(f"{operation.type} node {operation.name!r}: its implicit inputs {implicit} are not "
                             f"the names its bodies read from the enclosing scope {wanted}")
        for body in bodies(operation):
            body.check()


def separate_scopes(graph: "Graph", outer: frozenset = frozenset()) -> int:
    """Rename body-local values whose name a scope around them also defines (ONNX forbids a body to
    shadow an enclosing name; edits of either scope may have made such a pair).  Returns the count."""
    renamed = 0
    for operation in list(graph.operations.values()):
        for body in bodies(operation):
            taken = outer | defined_names(graph) | {v.name for v in captures(graph)}
            for variable in list(body.variables.values()):
                if variable.name in taken and not is_capture(body, variable):
                    name, index = f"{variable.name}_inner", 1
                    while name in taken or name in body.variables:
                        name, index = f"{variable.name}_inner_{index}", index + 1
                    body.rename_variable(variable, name)
                    renamed += 1
            renamed += separate_scopes(body, taken)
    return renamed
