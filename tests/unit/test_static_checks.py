"""Static checks of the project: ruff (lint + format) over every Python file, mypy on core.

The configuration lives in pyproject.toml ([tool.ruff], [tool.mypy]); these tests run the
tools the ``test`` extra installs, from this interpreter, and fail on any violation. Each check
is also run on a made-up file that breaks it, so a configuration that silently checks nothing
fails too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = REPO_ROOT / "pyproject.toml"


def _run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _ruff_findings(*args: str, cwd: Path = REPO_ROOT) -> dict[str, list[str]]:
    """File (relative to ``cwd``) -> ``"line:col CODE message"`` of each finding of a ruff run."""
    done = _run("ruff", *args, "--no-cache", "--output-format", "json", cwd=cwd)
    try:
        findings = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"ruff {' '.join(args)} failed (rc={done.returncode}):\n{done.stderr}")
    by_file: dict[str, list[str]] = {}
    for f in findings:
        where = f"{f['location']['row']}:{f['location']['column']}"
        by_file.setdefault(os.path.relpath(f["filename"], cwd), []).append(
            f"{where} {f['code']} {f['message']}"
        )
    return by_file


@pytest.fixture(scope="module")
def lint_findings() -> dict[str, list[str]]:
    return _ruff_findings("check", ".")


@pytest.fixture(scope="module")
def format_findings() -> dict[str, list[str]]:
    return _ruff_findings("format", "--check", ".")


def test_ruff_lint_is_clean(lint_findings):
    report = [
        f"{path}:{finding}"
        for path, findings in sorted(lint_findings.items())
        for finding in findings
    ]
    assert not report, "ruff check (fix with `ruff check --fix`):\n" + "\n".join(report)


def test_ruff_format_is_clean(format_findings):
    unformatted = sorted(format_findings)
    assert not unformatted, "ruff format would change (run `ruff format`):\n" + "\n".join(
        unformatted
    )


def test_core_is_mypy_strict_clean(tmp_path):
    done = _run("mypy", "--strict", "--cache-dir", str(tmp_path), "raytrain_hetero/core")
    assert done.returncode == 0, f"mypy --strict raytrain_hetero/core:\n{done.stdout}{done.stderr}"
    done = _run("mypy", "--cache-dir", str(tmp_path))  # the configured run (files = core)
    assert done.returncode == 0, f"mypy (pyproject configuration):\n{done.stdout}{done.stderr}"


# ------------------------------------------------------- the checks on made-up broken files


def test_ruff_configuration_catches_violations(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import sys\nimport os\nfrom typing import List\n\n\n"
        "def f(x: List[int] = []) -> int:\n"
        "    try:\n        return len(x)\n    except:\n        return 0\n"
    )
    found = _ruff_findings("check", "--config", str(PYPROJECT), "bad.py", cwd=tmp_path)
    codes = {finding.split()[1] for finding in found["bad.py"]}
    # import order, unused import, py311 idiom, mutable default, bare except
    assert {"I001", "F401", "UP035", "B006", "E722"} <= codes, codes


def test_ruff_format_uses_line_length_100(tmp_path):
    call = "value = some_function(first_argument, second_argument, third_argument, fourth_argument_x)\n"
    assert 88 < len(call) <= 100
    (tmp_path / "ok.py").write_text(call)
    (tmp_path / "bad.py").write_text("x = {  'a':1 }\n")
    found = _ruff_findings("format", "--check", "--config", str(PYPROJECT), ".", cwd=tmp_path)
    assert set(found) == {"bad.py"}


def test_mypy_is_strict_on_core_only(tmp_path):
    for layer in ("core", "app"):
        package = tmp_path / "raytrain_hetero" / layer
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "loose.py").write_text("def f(x):\n    return x\n\n\nD: dict = {}\n")
    (tmp_path / "raytrain_hetero" / "__init__.py").write_text("")
    done = _run(
        "mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(tmp_path / "cache"),
        "raytrain_hetero/core/loose.py", "raytrain_hetero/app/loose.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    flagged = {line.split(":")[0] for line in done.stdout.splitlines() if ": error:" in line}
    assert flagged == {"raytrain_hetero/core/loose.py"}, done.stdout
    assert "no-untyped-def" in done.stdout and "type-arg" in done.stdout
