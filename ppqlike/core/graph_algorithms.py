"""Graph algorithms of :class:`ppqlike.core.ir.Graph`, all from networkx.

A mixin: it reads the graph's ``operations`` (name -> Operation, in
insertion order), ``inputs``, ``outputs`` and ``name``, and never edits the graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import networkx as nx

from .errors import GraphError

if TYPE_CHECKING:  # the IR imports this module
    from .ir import Operation


class GraphAlgorithms:
    """Topological order, reachability and chain search over a graph's operations."""

    def to_networkx(self) -> nx.MultiDiGraph:
        """The op-level dataflow graph: one node per operation name, one edge per variable link."""
        dag = nx.MultiDiGraph()
        dag.add_nodes_from(self.operations)
        for operation in self.operations.values():
            for variable in operation.outputs:
                for consumer in variable.consumers:
                    dag.add_edge(operation.name, consumer.name, variable=variable.name)
        return dag

    def topological_sort(self) -> list[Operation]:
        """Operations in an order where every producer comes before its consumers.

        Ties are broken by insertion order so that the order is deterministic.
        Raises GraphError naming the operations of a cycle.
        """
        dag = self.to_networkx()
        position = {name: index for index, name in enumerate(self.operations)}
        try:
            order = list(nx.lexicographical_topological_sort(dag, key=position.__getitem__))
        except nx.NetworkXUnfeasible:
            cycle = [edge[0] for edge in nx.find_cycle(dag)]
            raise GraphError(f"graph {self.name!r} has a cycle through operations {cycle}") from None
        return [self.operations[name] for name in order]

    def input_dependent(self) -> set[str]:
        """Names of the operations whose results depend on a graph input (the others compute from
        parameters and constants alone)."""
        dag = self.to_networkx()
        source = ("graph inputs",)   # not an operation name
        names = {variable.name for variable in self.inputs}
        dag.add_node(source)
        dag.add_edges_from((source, operation.name) for operation in self.operations.values()
                           if any(v is not None and v.name in names for v in operation.inputs))
        return nx.descendants(dag, source)

    def descendants(self, operation: Operation) -> set[Operation]:
        """Every operation reachable downstream of ``operation``."""
        return {self.operations[n] for n in nx.descendants(self.to_networkx(), operation.name)}

    def ancestors(self, operation: Operation) -> set[Operation]:
        """Every operation upstream of ``operation``."""
        return {self.operations[n] for n in nx.ancestors(self.to_networkx(), operation.name)}

    def find_chains(self, pattern: Sequence[str | Callable[[Operation], bool]],
                    exclusive: bool = True) -> list[list[Operation]]:
        """Find chains ``op0 -> op1 -> ...`` whose ops match ``pattern`` in order.

        A pattern element is an op type or a predicate.  With ``exclusive``
        every intermediate op's outputs are read only by the next op of the
        chain (so the chain can be fused).  Matching is done by networkx's
        subgraph isomorphism on the op graph.
        """
        def matches(element, operation):
            return operation.type == element if isinstance(element, str) else bool(element(operation))

        template = nx.DiGraph()
        for index, element in enumerate(pattern):
            template.add_node(index, element=element)
            if index:
                template.add_edge(index - 1, index)
        dag = nx.DiGraph(self.to_networkx())
        for name in dag.nodes:
            dag.nodes[name]["operation"] = self.operations[name]
        matcher = nx.algorithms.isomorphism.DiGraphMatcher(
            dag, template, node_match=lambda g, t: matches(t["element"], g["operation"]))
        chains = []
        for mapping in matcher.subgraph_monomorphisms_iter():
            by_index = {index: self.operations[name] for name, index in mapping.items()}
            chain = [by_index[i] for i in range(len(pattern))]
            if exclusive and not self._chain_is_exclusive(chain):
                continue
            chains.append(chain)
        order = {op.name: i for i, op in enumerate(self.topological_sort())}
        chains.sort(key=lambda c: order[c[0].name])
        return chains

    def _chain_is_exclusive(self, chain: list[Operation]) -> bool:
        """True when every output of every op but the last is read only by the next op."""
        for position, operation in enumerate(chain[:-1]):
            for variable in operation.outputs:
                if variable in self.outputs:
                    return False
                if any(consumer is not chain[position + 1] for consumer in variable.consumers):
                    return False
        return True
