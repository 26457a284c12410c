"""Layer rules for the parts the dedupe owns: workloads and inference never import the app."""

from __future__ import annotations

import ast
from pathlib import Path

import raytrain_hetero

PACKAGE = Path(raytrain_hetero.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_workloads_and_inference_do_not_import_app_tune_or_benchmarks() -> None:
    checked = 0
    for package in ("workloads", "inference"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            checked += 1
            bad = {
                m
                for m in imported_modules(path)
                if m.startswith(("raytrain_hetero.app", "raytrain_hetero.tune", "benchmarks"))
            }
            assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"
    assert checked >= 10


def test_the_one_atomic_write_and_rounding() -> None:
    # No private tempfile + os.replace writers left in the files the dedupe cleaned up.
    for rel in (
        "app/outputs.py",
        "workloads/normalization.py",
        "../benchmarks/suite.py",
        "../benchmarks/report.py",
        "inference/predict.py",
        "app/predict.py",
    ):
        text = (PACKAGE / rel).read_text()
        assert "mkstemp" not in text and "os.replace" not in text, rel
    assert "argsort" not in (PACKAGE / "inference" / "predict.py").read_text()
