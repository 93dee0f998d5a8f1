"""caramel.ring is the reference's pure math: it imports the standard library, NumPy and itself only
(and two leaves of caramel that import only the standard library: its errors and :mod:`caramel.cores`).

No Numba, no CuPy, nothing of the client or the executors: the reference interpreter, which
computes with the ring, depends on none of them. Every import counts, lazy ones inside functions too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

RING = Path(__file__).resolve().parents[2] / "caramel" / "ring"
ALLOWED = ("numpy", "caramel.ring", "caramel.errors", "caramel.cores")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names += [f"{node.module}.{a.name}" for a in node.names]  # `from caramel import x` imports caramel.x
    return names


def test_ring_imports_only_numpy_and_itself():
    files = sorted(RING.glob("*.py"))
    assert len(files) >= 10  # the package's modules, not an empty folder
    bad = sorted({f"{f.name}: {name}" for f in files for name in _imports(f)
                  if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"
                  and not any(name == a or name.startswith(a + ".") for a in ALLOWED)})
    assert bad == [], f"caramel.ring imports {bad}"
