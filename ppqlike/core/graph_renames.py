"""Renaming a graph's variables and operations (a mixin of :class:`ppqlike.core.ir.Graph`).

A rename keeps the name tables, the links and the bodies of If/Loop/Scan (which read outer values by name)
consistent, and bumps ``graph.revision`` so executors recompile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import GraphError
from .subgraphs import has_bodies, rebind_implicit_input

if TYPE_CHECKING:
    from .ir import Operation, Variable


class GraphRenames:
    """Rename methods of :class:`~ppqlike.core.ir.Graph` (reads and writes its ``variables``/``operations``)."""

    def rename_variable(self, variable: Variable, new_name: str) -> None:
        """Give ``variable`` a new, unused name."""
        self.revision += 1
        self._own_variable(variable)
        old_name = variable.name
        if self._move_name(self.variables, variable, new_name):
            for operation in dict.fromkeys(variable.consumers):
                if operation.attributes and has_bodies(operation):  # a body reads it by name: follow
                    rebind_implicit_input(operation, old_name, new_name)

    def rename_operation(self, operation: Operation, new_name: str) -> None:
        """Give ``operation`` a new, unused name."""
        self.revision += 1
        self._own_operation(operation)
        self._move_name(self.operations, operation, new_name)

    def _move_name(self, table: dict, item, new_name: str) -> bool:
        """File ``item`` under ``new_name`` in ``table`` (the graph's variables or operations); False when that
        is its name already; a name taken by another raises GraphError."""
        if new_name == item.name:
            return False
        if new_name in table:
            raise GraphError(f"cannot rename {item.name!r} to {new_name!r}: the name is taken")
        del table[item.name]
        item.name = new_name
        table[new_name] = item
        return True
