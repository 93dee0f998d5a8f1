"""bench/harness.py and the laboratory's rules, without a GPU: options cast like build_plan's defaults, kernel settings
only as a configuration value, the A/B children's command lines and table, the JSON record; and the rules every
benchmark keeps (caramel's public names only, no sys.path edits, no module state written, no scripts imported)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from bench import harness
from bench.__main__ import COMMANDS
from tests.conftest import REPO

BENCH = REPO / "bench"


def test_plan_options_are_cast_like_the_defaults():
    assert harness.plan_options("") == {}
    assert harness.plan_options("max_outputs=1, fuse_epilogue=False,fuse_ntt=all") == {
        "max_outputs": 1, "fuse_epilogue": False, "fuse_ntt": "all"}
    assert harness.plan_options("fuse_ntt=sud_lift+mod,row_order=batch") == {"fuse_ntt": "sud_lift,mod",
                                                                            "row_order": "batch"}
    with pytest.raises(SystemExit, match="unknown build_plan option 'max_rows'"):
        harness.plan_options("max_rows=3")


def test_kernel_settings_only_as_a_configuration():
    assert harness.kernel_config([]) is None and harness.kernel_config(["default", ""]) is None
    assert harness.kernel_options(None) == {}
    assert harness.config_sets([]) == [("default", None)]
    if importlib.util.find_spec("caramel.backends.cuda.config") is None:
        with pytest.raises(SystemExit, match="need caramel.backends.cuda.config"):
            harness.config_sets(["default", "ntt.split_from=6/6"])
    else:
        from caramel.backends.cuda.config import KernelConfig

        (label, config), = harness.config_sets(["ntt.split_from=6/6"])
        assert label == "ntt.split_from=6/6" and config == KernelConfig().with_settings(["ntt.split_from=6/6"])
        assert harness.kernel_options(config) == {"kernels": config}


def test_the_family_archive_is_looked_up_as_programs_are(tmp_path, monkeypatch):
    """bench multi and bench timeline find BootstrapLike_51L.tar.xz in the first program folder holding it."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / "BootstrapLike_51L.tar.xz").write_bytes(b"")
    monkeypatch.setattr(harness, "program_dirs", lambda: [first, second])
    assert harness.family_archive() == str(second / "BootstrapLike_51L.tar.xz")
    with pytest.raises(SystemExit, match="Mul_4L.tar.xz not found"):
        harness.family_archive("Mul_4L")


def test_the_ab_children_lose_only_the_parents_options():
    argv = ["--base", ".ab", "--n", "4096", "--rounds=3", "--json", "x.json", "--base=.ab2", "--config", "a=1"]
    assert harness.strip_options(argv, {"--base": 1, "--rounds": 1, "--json": 1}) == ["--n", "4096", "--config",
                                                                                      "a=1"]
    runs = [("this tree #1", {"commit": "abc", "figures": [{"what": "replay", "value": 13.2, "unit": "ms"},
                                                          {"what": "replay", "value": 13.5, "unit": "ms",
                                                           "config": "x=1"}]}),
            ("base .ab #1", None)]
    table = harness.ab_table(runs).splitlines()
    assert table[0] == "| what | this tree #1 (abc) | base .ab #1 (failed) |"
    assert "| replay | 13.2 ms |  |" in table and "| replay [x=1] | 13.5 ms |  |" in table


def test_the_record_names_date_commit_device_and_command(tmp_path, capsys):
    rec = harness.Record("replay", ["--n", "1024"], "cpu-plan")
    rec.add("replay", 12.5, "ms", min=12.0, max=13.0, config="default")
    assert rec.check("digest = reference", True)
    assert not rec.check("corpus", False, "2 mismatches")
    assert rec.finish(str(tmp_path / "r.json")) == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["command"] == "python -m bench replay --n 1024" and doc["commit"] and doc["device"].startswith("CPU")
    assert doc["date"].endswith("UTC") and doc["failures"] == ["corpus (2 mismatches)"]
    assert doc["figures"][0] == {"what": "replay", "value": 12.5, "unit": "ms", "min": 12.0, "max": 13.0,
                                 "config": "default"}
    assert "| replay | 12.5 ms (min 12, max 13) |" in capsys.readouterr().out


def test_a_copy_names_its_commit(tmp_path):
    (tmp_path / ".rev").write_text("9d91a43\n")
    assert harness.commit(tmp_path) == "9d91a43"


def _modules() -> list[Path]:
    return sorted(BENCH.glob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_benchmarks_keep_the_laboratory_rules(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("scripts") and "._" not in node.module, f"{path.name}: {node.module}"
            if node.module.startswith("caramel"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports caramel's private {private} from {node.module}"
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("scripts") for a in node.names), path.name
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
            pytest.fail(f"{path.name}:{node.lineno} touches sys.path")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
            pytest.fail(f"{path.name}:{node.lineno} calls setattr")
        if isinstance(node, ast.Assign):  # no assignment to an attribute of an imported caramel module
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in {
                        "caramel", "ntt", "elementwise", "order", "cuda_graph", "NcclFabric"}:
                    pytest.fail(f"{path.name}:{node.lineno} writes {t.value.id}.{t.attr}")


def test_every_command_is_a_module_or_named_missing():
    for name in COMMANDS:
        assert (BENCH / f"{name}.py").exists() or name in ("throughput", "cluster"), name


def test_the_laboratory_is_not_in_the_wheel():
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["caramel*"]
