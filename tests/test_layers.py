"""The house's layering (DESIGN.md §1): imports go downward only, no circles, and a core import stays small."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import networkx as nx

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ppqlike")

#: top-level part of ppqlike -> its layer (DESIGN.md §1); the package root is lazy and not a layer
LAYERS = {"core": 1, "io": 2, "executor": 3, "platforms": 4, "optim": 5,
          "api": 6, "cli": 6, "export": 6, "analysis": 6, "ppq_names": 6, "lib": 7, "quantization": 7}


def module_name(path: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
    return relative[:-len(".__init__")] if relative.endswith(".__init__") else relative


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (never imported at run time)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imported_modules(path: str) -> set[tuple[str, tuple[str, ...]]]:
    """Every ppqlike import of ``path``, at the top or inside functions: (module, names taken from it)."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in _runtime_nodes(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {(alias.name, ()) for alias in node.names if alias.name.startswith("ppqlike")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("ppqlike"):
                found.add((target, tuple(alias.name for alias in node.names)))
    return found


def import_graph() -> nx.DiGraph:
    """Module -> the modules it imports.  ``from package import module`` imports that module (the package's
    ``__init__`` is already loaded by then); ``from module import name`` imports the module."""
    paths = [os.path.join(folder, f) for folder, _, files in os.walk(PACKAGE) for f in files if f.endswith(".py")]
    modules = {module_name(p): p for p in paths}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target, names in imported_modules(path):
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            targets = submodules if submodules and len(submodules) == len(names) else [target, *submodules]
            for target in targets:
                while target not in modules and "." in target:  # a symbol's module
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name and target != "ppqlike":
                    graph.add_edge(name, target)
    return graph


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_imports_go_downward_only():
    wrong = [(a, b) for a, b in import_graph().edges
             if part(a) in LAYERS and part(b) in LAYERS and LAYERS[part(b)] > LAYERS[part(a)]]
    assert wrong == []


def test_no_import_circle():
    assert list(nx.simple_cycles(import_graph())) == []


def test_core_import_loads_no_higher_layer():
    code = ("import sys, ppqlike.core.quant, ppqlike.core.quant_graph, ppqlike.core.op_facts; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('ppqlike'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert [m for m in loaded if m != "ppqlike" and part(m) != "core"] == []


def test_package_root_offers_every_public_name():
    import ppqlike
    for name in ppqlike.__all__:
        assert getattr(ppqlike, name) is not None
    assert ppqlike.analysis.graphwise_error_analyse is ppqlike.graphwise_error_analyse


def test_no_module_past_500_lines():
    long = {module_name(os.path.join(folder, f)): n for folder, _, files in os.walk(PACKAGE) for f in files
            if f.endswith(".py") and (n := sum(1 for _ in open(os.path.join(folder, f), encoding="utf-8"))) > 500}
    assert long == {}
