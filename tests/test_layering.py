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


#: Each layer imports only its own and lower ones (modules not named here, caramel's own small modules such as
#: ``caramel.program``, ``caramel.expr`` and ``caramel.target``, are the lowest); ``plan`` and ``backends`` share a
#: layer and never import each other.
LAYERS = {"caramel.ring": 1, "caramel.plan": 2, "caramel.plan_cache": 2, "caramel.backends": 2, "caramel.ckks": 3,
          "caramel.execute": 3, "caramel.api": 4, "caramel.batch": 4, "caramel.cli": 4, "caramel.profile": 4,
          "caramel.scaling": 4, "caramel.results": 4, "caramel.userdata": 4, "caramel.__main__": 4,
          "caramel.options": 4, "caramel.instance": 4, "caramel.executor": 4, "caramel.cluster": 4,
          "caramel.timeline": 4, "caramel.launch": 4}


def layer_of(module: str) -> tuple[int, str]:
    """(rank, name) of the layer of ``module`` (see :data:`LAYERS`)."""
    for name, rank in LAYERS.items():
        if module == name or module.startswith(name + "."):
            return rank, name
    return 0, "caramel"


def test_no_import_runs_up_a_layer():
    bad = []
    for a, b in import_graph().edges():
        (ra, la), (rb, lb) = layer_of(a), layer_of(b)
        if rb > ra or ({la, lb} == {"caramel.plan", "caramel.backends"}):
            bad.append(f"{a} -> {b}")
    assert bad == [], f"imports running up a layer: {bad}"
