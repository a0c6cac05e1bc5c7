"""Pickling a graph as flat tables (a mixin of :class:`ppqlike.core.ir.Graph`).

The linked graph (variables know their producers and consumers, operations their variables) nests too deeply
for pickle's recursion; as tables of names it does not.  Configs and platforms travel as they are, and shared
config objects stay shared.  Used to send graphs to Ray workers.
"""

from __future__ import annotations


class GraphTables:
    """``__reduce__`` of :class:`~ppqlike.core.ir.Graph`."""

    def __reduce__(self):
        """Pickle as flat tables (the linked graph nests too deeply for pickle's recursion); configs and
        platforms travel as they are, shared config objects stay shared."""
        variables = [(v.name, v.value, v.shape, v.dtype) for v in self.variables.values()]
        operations = [(op.name, op.type, op.attributes, op.domain, [None if v is None else v.name for v in op.inputs],
                       [v.name for v in op.outputs], op.platform, op.config) for op in self.operations.values()]
        return (_graph_from_tables, (type(self), self.name, self.opset, self.metadata, self.revision, variables,
                                     operations, [v.name for v in self.inputs], [v.name for v in self.outputs]))


def _graph_from_tables(graph_type, name, opset, metadata, revision, variables, operations, inputs, outputs):
    """The graph of type ``graph_type`` that :meth:`GraphTables.__reduce__` flattened."""
    graph = graph_type(name, opset)
    graph.metadata = metadata
    for variable_name, value, shape, dtype in variables:
        graph.create_variable(variable_name, value=value, shape=shape, dtype=dtype)
    table = graph.variables
    for op_name, op_type, attributes, domain, reads, writes, platform, config in operations:
        operation = graph.create_operation(op_type, [None if n is None else table[n] for n in reads],
                                           [table[n] for n in writes], attributes, op_name, domain)
        operation.platform, operation.config = platform, config
    graph.inputs = [table[n] for n in inputs]
    graph.outputs = [table[n] for n in outputs]
    graph.revision = revision
    return graph
