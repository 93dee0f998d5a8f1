"""No module of caramel holds tuning state that code writes at run time.

Settings are frozen values passed explicitly (:mod:`caramel.backends.cuda.config`); module-level names are constants,
imported code never rebinds another module's names, and module state that does change is a private resource (a
thread pool, a lock, a cache), never a setting. Checked on the source (every module of ``caramel/``, by its AST):

* no assignment, deletion or ``setattr`` of an attribute of an imported module of caramel;
* a ``global`` statement names only private lower-case resources (``_pool``), never a setting;
* no function rebinds, mutates in place or assigns into a module-level constant (a public UPPER_CASE name);
* the backends' module-level constants are immutable values (no list, dict or set: a table is a
  ``MappingProxyType`` or a tuple).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "caramel"
FILES = sorted(ROOT.rglob("*.py"))
UPPER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # a public constant (a private _UPPER name may be a cache: a resource)
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove", "add",
            "discard", "__setitem__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in FILES}


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def module_aliases(path: Path, root: ast.Module) -> set[str]:
    """Names that a module binds to caramel's modules: ``import caramel.x as z`` (z), ``import caramel`` (caramel),
    ``from caramel.p import m`` for a module m."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = set()
    for node in ast.walk(root):
        if isinstance(node, ast.Import):
            out.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "caramel")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.update(a.asname or a.name for a in node.names if f"{base}.{a.name}" in MODULES)
    return out


def constants(root: ast.Module) -> set[str]:
    """The module-level UPPER_CASE names a module defines."""
    out = set()
    for node in root.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        out.update(t.id for t in targets if isinstance(t, ast.Name) and UPPER.match(t.id))
    return out


def base_name(node) -> str | None:
    """The name at the root of ``a.b[c].d`` (None for anything else)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def written(root: ast.Module, in_functions: bool = False):
    """(target expression, line) of every assignment, augmented assignment and deletion (``in_functions``: those in
    a function body, which run after import)."""
    scopes = [f for f in ast.walk(root) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for node in {id(n): n for f in (scopes if in_functions else [root]) for n in ast.walk(f)}.values():
        if isinstance(node, ast.Assign):
            yield from ((t, node.lineno) for t in node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            yield node.target, node.lineno
        elif isinstance(node, ast.Delete):
            yield from ((t, node.lineno) for t in node.targets)
        elif isinstance(node, (ast.For, ast.comprehension)):
            yield node.target, getattr(node, "lineno", 0)


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT.parent)}:{line}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_writes_another_modules_names(path):
    root = tree(path)
    aliases = module_aliases(path, root)
    bad = [where(path, line) for target, line in written(root)
           if isinstance(target, (ast.Attribute, ast.Subscript)) and base_name(target) in aliases]
    bad += [where(path, node.lineno) for node in ast.walk(root) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args
            and base_name(node.args[0]) in aliases]
    assert bad == [], f"writes to an imported module's names: {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_global_statements_name_private_resources_only(path):
    bad = [f"{where(path, node.lineno)} {name}" for node in ast.walk(tree(path)) if isinstance(node, ast.Global)
           for name in node.names if not re.fullmatch(r"_[a-z][a-z0-9_]*", name)]
    assert bad == [], f"global statements rebinding settings: {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_constant_is_changed(path):
    root = tree(path)
    mine = constants(root)
    bad = [where(path, line) for target, line in written(root, in_functions=True) if (
        (isinstance(target, ast.Name) and target.id in mine)
        or (isinstance(target, (ast.Attribute, ast.Subscript)) and UPPER.match(
            target.attr if isinstance(target, ast.Attribute) else base_name(target) or "")))]
    bad += [where(path, node.lineno) for node in ast.walk(root) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
            and UPPER.match(node.func.value.attr if isinstance(node.func.value, ast.Attribute)
                            else base_name(node.func.value) or "")]
    assert bad == [], f"module constants changed: {bad}"


@pytest.mark.parametrize("path", [p for p in FILES if "backends" in p.parts], ids=lambda p: str(p.relative_to(ROOT)))
def test_backend_constants_are_immutable(path):
    mutable = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
    bad = [where(path, node.lineno) for node in tree(path).body if isinstance(node, (ast.Assign, ast.AnnAssign))
           and isinstance(node.value, mutable)
           and any(isinstance(t, ast.Name) and UPPER.match(t.id)
                   for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    assert bad == [], f"mutable module-level settings: {bad}"


def test_kernel_settings_are_frozen_values():
    from caramel.backends.cuda.config import KernelConfig

    config = KernelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ntt.warps = 2  # type: ignore[misc]
    assert hash(config) == hash(KernelConfig()) and config == KernelConfig()


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check flags its example: a write to an imported module's setting, a global setting, a changed constant."""
    bad = tmp_path / "bad.py"
    bad.write_text("from caramel.backends.cuda import ntt\nimport caramel.plan.order as order\nimport sys\nLIMIT = 3\n"
                   "ntt.LAZY = 0\ndef f():\n    global LIMIT\n    LIMIT = 4\n    ntt.WARPS = 2\n    setattr(order, 'FUSED', (1, 1))\n"
                   "    TABLE[1] = 2\n    TABLE.append(3)\n")
    root = tree(bad)
    aliases = module_aliases(ROOT / "x.py", root)
    assert aliases == {"ntt", "order"}
    assert sorted(t.attr for t, _ in written(root) if isinstance(t, ast.Attribute) and base_name(t) in aliases) == [
        "LAZY", "WARPS"]
    assert [t.id for t, _ in written(root, in_functions=True) if isinstance(t, ast.Name)] == ["LIMIT"]
    assert [n for node in ast.walk(root) if isinstance(node, ast.Global) for n in node.names] == ["LIMIT"]
    assert constants(root) == {"LIMIT"}
