"""The report every graph-formatting step returns, and dead-code removal shared by the steps.

Reads the graph's op types; :func:`remove_dead_code` edits the graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..core.ir import Graph


@dataclass
class FormatReport:
    """What formatting did: ``counts`` of changes, ``skipped`` counts of candidates left alone and why,
    ``notes`` in words, and the op-type counts before and after."""

    counts: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)

    @property
    def changed(self) -> bool:
        """True when any edit was made."""
        return any(self.counts.values())

    def merge(self, later: "FormatReport") -> "FormatReport":
        """This report followed by ``later``: counts add up, ops_after is the later one's."""
        return FormatReport(self.counts + later.counts, self.skipped + later.skipped, self.notes + later.notes,
                            self.ops_before or later.ops_before, later.ops_after)

    def __str__(self) -> str:
        before, after = sum(self.ops_before.values()), sum(self.ops_after.values())
        lines = [f"{before} ops -> {after} ops"]
        lines += [f"  {key}: {value}" for key, value in sorted(self.counts.items()) if value]
        lines += [f"  left alone, {key}: {value}" for key, value in sorted(self.skipped.items()) if value]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def start_report(graph: Graph) -> FormatReport:
    """A report whose ``ops_before`` is the graph's current op-type count."""
    return FormatReport(ops_before=Counter(op.type for op in graph.operations.values()))


def finish_report(graph: Graph, report: FormatReport) -> FormatReport:
    """Record the graph's op-type count as ``ops_after`` and return the report."""
    report.ops_after = Counter(op.type for op in graph.operations.values())
    return report


def remove_dead_code(graph: Graph) -> FormatReport:
    """Remove ops whose outputs nothing reads (graph outputs are read) and variables nothing links to.

    Graph inputs stay even when unread: they are the graph's interface.
    """
    report = start_report(graph)
    for operation in reversed(graph.topological_sort()):  # consumers before their producers
        if not any(v.consumers or v in graph.outputs for v in operation.outputs):
            graph.remove_operation(operation)
            report.counts["dead ops removed"] += 1
    interface = set(map(id, graph.inputs)) | set(map(id, graph.outputs))
    for variable in list(graph.variables.values()):
        if variable.producer is None and not variable.consumers and id(variable) not in interface:
            graph.remove_variable(variable)
            report.counts["dead variables removed"] += 1
    return finish_report(graph, report)
