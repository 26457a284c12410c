"""raytrain_hetero.core stays pure: standard library and numpy only, never ray or torch.

Checked two ways for every module in the package: statically (the source's import
statements, including ones inside functions) and dynamically (importing all of core in a
fresh interpreter must not load ray or torch, e.g. through raytrain_hetero/__init__.py).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from repo_python import run_in_repo

import raytrain_hetero.core

CORE_DIR = Path(raytrain_hetero.core.__file__).resolve().parent
REPO_ROOT = CORE_DIR.parent.parent
FORBIDDEN = frozenset({"ray", "torch", "torchvision", "torchgeo"})
ALLOWED_THIRD_PARTY = frozenset({"numpy"})
CORE_MODULES = sorted(CORE_DIR.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_top_level_names(path: Path) -> set[str]:
    """Top-level package names of every absolute import in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value.split(".")[0])
    return names


def test_core_has_modules_to_check():
    assert any(path.name == "allocation.py" for path in CORE_MODULES)


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.name)
def test_core_source_never_imports_ray_or_torch(path):
    forbidden = _imported_top_level_names(path) & FORBIDDEN
    assert not forbidden, f"{_module_name(path)} imports {sorted(forbidden)}; core must stay pure"


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.name)
def test_core_source_imports_only_stdlib_numpy_and_own_package(path):
    allowed = set(sys.stdlib_module_names) | ALLOWED_THIRD_PARTY | {"raytrain_hetero", "__future__"}
    others = _imported_top_level_names(path) - allowed
    assert not others, (
        f"{_module_name(path)} imports {sorted(others)}; core allows stdlib + numpy only"
    )


def test_parser_sees_forbidden_imports(tmp_path):
    # Guard against a checker that silently finds nothing.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nimport torch.nn as nn\nfrom ray import train\n"
        "def f():\n    import torchgeo\n    return importlib.import_module('torchvision')\n"
    )
    assert _imported_top_level_names(sample) >= {"os", "torch", "ray", "torchgeo", "torchvision"}


def test_importing_core_loads_neither_ray_nor_torch():
    modules = [_module_name(path) for path in CORE_MODULES]
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    completed = run_in_repo(["-c", script], timeout=120)
    assert completed.returncode == 0, completed.stderr
    loaded = set(json.loads(completed.stdout.strip().splitlines()[-1]))
    assert not loaded & FORBIDDEN, (
        f"importing raytrain_hetero.core loaded {sorted(loaded & FORBIDDEN)}; core (and the "
        "package __init__ it passes through) must not import ray or torch eagerly"
    )
