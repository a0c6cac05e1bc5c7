"""Renaming a graph's variables and operations (a mixin of :class:`ppqlike.core.ir.Graph`).

A rename keeps the name tables, the links and the bodies of If/Loop/Scan (which read outer values by name)
consistent, and bumps ``graph.revision`` so executors recompile.
"""

from __future__ import annotations

from .errors import GraphError
from .subgraphs import has_bodies, rebind_implicit_input


class GraphRenames:
    """Rename methods of :class:`~ppqlike.core.ir.Graph` (reads and writes its ``variables``/``operations``)."""

    def rename_variable(self, variable: Variable, new_name: str) -> None:
        """Give ``variable`` a new, unused name."""
        self.revision += 1
        self._own_variable(variable)
        if new_name == variable.name:
            return
        if new_name in self.variables:
            raise GraphError(f"cannot rename {variable.name!r} to {new_name!r}: the name is taken")
        old_name = variable.name
        del self.variables[variable.name]
        variable.name = new_name
        self.variables[new_name] = variable
        for operation in dict.fromkeys(variable.consumers):
            if operation.attributes and has_bodies(operation):  # a body reads it by name: follow
                rebind_implicit_input(operation, old_name, new_name)

    def rename_operation(self, operation: Operation, new_name: str) -> None:
        """Give ``operation`` a new, unused name."""
        self.revision += 1
        self._own_operation(operation)
        if new_name == operation.name:
            return
        if new_name in self.operations:
            raise GraphError(f"cannot rename {operation.name!r} to {new_name!r}: the name is taken")
        del self.operations[operation.name]
        operation.name = new_name
        self.operations[new_name] = operation
