"""The package's import graph: no circles, and the reference interpreter stays independent.

Every ``import`` in every module counts, lazy ones inside functions included. An edge goes to the
module named (``from caramel.plan import dag`` -> ``caramel.plan.dag``; ``from caramel.plan import
build_plan`` -> ``caramel.plan``); circles are the strongly connected components of that graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "caramel"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """caramel's modules and the imports between them."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                if t in files and t != name:
                    g.add_edge(name, t)
    return g


def test_no_import_circles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == [], f"import circles: {cycles}"


def test_reference_imports_no_plan_or_backend():
    g = import_graph()
    bad = [m for m in nx.descendants(g, "caramel.execute.reference")
           if m.startswith(("caramel.plan", "caramel.backends"))]
    assert bad == [], f"caramel.execute.reference reaches {sorted(bad)}"
