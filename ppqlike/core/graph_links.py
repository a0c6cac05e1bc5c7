"""The links a graph keeps consistent: producers, consumers, registered names and the graph's interface.

:meth:`ppqlike.core.ir.Graph.check` calls :func:`check_links`: the reader of model files and the tests call
it after an edit, to find a broken link where it was made rather than where it is read.  Reads the graph;
writes nothing.
"""

from __future__ import annotations

from .errors import GraphError
from .subgraphs import check_bodies


def check_links(graph) -> None:
    """Raise GraphError if any producer/consumer link is inconsistent."""
    for variable in graph.variables.values():
        if variable.producer is not None:
            if graph.operations.get(variable.producer.name) is not variable.producer \
                    or variable not in variable.producer.outputs:
                raise GraphError(f"variable {variable.name!r}: producer link is broken")
        for consumer in variable.consumers:
            if graph.operations.get(consumer.name) is not consumer or variable not in consumer.inputs:
                raise GraphError(f"variable {variable.name!r}: consumer {consumer.name!r} link is broken")
    for operation in graph.operations.values():
        for variable in operation.inputs:
            if variable is None:
                continue
            if graph.variables.get(variable.name) is not variable:
                raise GraphError(f"operation {operation.name!r} reads unknown variable {variable.name!r}")
            if variable.consumers.count(operation) != operation.inputs.count(variable):
                raise GraphError(f"operation {operation.name!r}: consumer count of {variable.name!r} is off")
        for variable in operation.outputs:
            if graph.variables.get(variable.name) is not variable or variable.producer is not operation:
                raise GraphError(f"operation {operation.name!r}: output {variable.name!r} link is broken")
    for variable in graph.inputs + graph.outputs:
        if graph.variables.get(variable.name) is not variable:
            raise GraphError(f"graph interface variable {variable.name!r} is not in the graph")
    for variable in graph.inputs:
        if variable.producer is not None:
            raise GraphError(f"graph input {variable.name!r} is written by {variable.producer.name!r}")
    for name, variable in graph.variables.items():
        if variable.name != name:
            raise GraphError(f"variable {variable.name!r} is registered under another name {name!r}")
    for name, operation in graph.operations.items():
        if operation.name != name:
            raise GraphError(f"operation {operation.name!r} is registered under another name {name!r}")
    check_bodies(graph)
