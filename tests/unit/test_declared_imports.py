"""Every third-party import of the project is declared in pyproject.toml.

A module that is present only because something else pulled it in, or because it was
installed by hand, passes on a used machine and fails on a fresh one (scipy did, once). The
imports are read with :mod:`ast` (nothing of the project runs) and mapped to the distributions
that provide them with :func:`importlib.metadata.packages_distributions`. Imports of the
package itself must be covered by ``[project] dependencies`` (``pip install -e .`` is all a
user runs before training), except a feature extra's (``[tracking]``: every extra but ``test``)
imported inside a function, so every module still imports on a plain install; tests, scripts,
examples and deploy may also use the extras.
This is the check of ``../shared/tools/check_declared_imports.py``, inside the suite.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("raytrain_hetero",)
OTHER_DIRS = ("tests", "scripts", "examples", "deploy", "benchmarks", "docs")
# Import names whose distribution is named differently, for when it is not installed here.
IMPORT_ALIASES = {
    "yaml": "pyyaml",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
}


@dataclass(frozen=True)
class Declared:
    """The distributions pyproject.toml declares (normalised names).

    Attributes:
        runtime: ``[project] dependencies``.
        extras: Every ``[project.optional-dependencies]`` entry.
        features: The entries of the feature extras (every extra but ``test``).
    """

    runtime: frozenset[str]
    extras: frozenset[str]
    features: frozenset[str] = frozenset()


def normalise(name: str) -> str:
    """A distribution name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution of a requirement string (``"ray[train]==2.60.0"`` -> ``"ray"``)."""
    return normalise(re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0])


def read_declared(pyproject: Path) -> Declared:
    """The declared distributions of a pyproject.toml."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    extras = [r for reqs in optional.values() for r in reqs]
    features = [r for name, reqs in optional.items() if name != "test" for r in reqs]
    return Declared(
        runtime=frozenset(requirement_name(r) for r in project.get("dependencies", [])),
        extras=frozenset(requirement_name(r) for r in extras),
        features=frozenset(requirement_name(r) for r in features),
    )


def top_level_imports(directory: Path) -> dict[str, str]:
    """Top-level name of every absolute import under ``directory`` -> first ``file:line``."""
    found: dict[str, str] = {}
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(
                    name.split(".")[0], f"{path.relative_to(directory.parent)}:{node.lineno}"
                )
    return found


def module_level_imports(directory: Path) -> set[str]:
    """Top-level names imported under ``directory`` outside every function (at import time)."""
    found: set[str] = set()
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        nested: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                nested |= {id(inner) for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in nested:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def undeclared_imports(
    root: Path,
    package_dirs: tuple[str, ...] = PACKAGE_DIRS,
    other_dirs: tuple[str, ...] = OTHER_DIRS,
    distributions: dict[str, list[str]] | None = None,
) -> list[str]:
    """One line per third-party import under ``root`` that pyproject.toml does not cover.

    Args:
        root: Project root (holds pyproject.toml and the directories).
        package_dirs: Directories whose imports need a runtime dependency.
        other_dirs: Directories whose imports may also come from an extra.
        distributions: Import name -> distributions providing it (default: this interpreter's).
    """
    declared = read_declared(root / "pyproject.toml")
    if distributions is None:
        distributions = importlib.metadata.packages_distributions()
    dirs = [root / d for d in (*package_dirs, *other_dirs) if (root / d).is_dir()]
    # The project's own modules: top-level entries of the root and every module file's stem
    # (tests import helpers such as ``train_loops`` by their bare name).
    local = {p.stem for p in root.iterdir() if p.is_dir() or p.suffix == ".py"}
    local |= {p.stem for d in dirs for p in d.rglob("*.py")}
    problems = []
    for directory in dirs:
        wanted = declared.runtime
        eager: set[str] = set()
        if directory.name not in package_dirs:
            wanted = declared.runtime | declared.extras
        else:
            eager = module_level_imports(directory)
        for module, where in sorted(top_level_imports(directory).items()):
            if module in sys.stdlib_module_names or module in local or module == "__future__":
                continue
            owners = {normalise(d) for d in distributions.get(module, [])}
            if not owners:
                if normalise(IMPORT_ALIASES.get(module, module)) in wanted:
                    continue  # declared, just not installed in this interpreter
                problems.append(
                    f"{where}: imports {module!r}, which is neither installed nor declared"
                )
            elif not owners & wanted and owners & declared.features and module in eager:
                problems.append(
                    f"{where}: imports {module!r} of an optional extra at module level. Fix: "
                    "import it inside the function that needs it (a plain install lacks it)"
                )
            elif not owners & wanted and not (owners & declared.features and module not in eager):
                kind = "[project] dependencies" if wanted is declared.runtime else "pyproject.toml"
                problems.append(
                    f"{where}: imports {module!r} from {sorted(owners)}, which {kind} does not "
                    f"declare. Fix: add {sorted(owners)[0]!r} with a version range"
                )
    return problems


def test_every_third_party_import_is_declared():
    problems = undeclared_imports(REPO_ROOT)
    assert not problems, "undeclared imports (a fresh machine lacks them):\n" + "\n".join(problems)


def test_the_pins_that_must_stay():
    # See ../shared/DESIGN.md: these four are pinned together; torch 2.13 breaks torchvision.
    pins = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert {"torch==2.15.0", "torchvision==0.29.2", "ray[default,train,tune]==2.60.0",
            "torchgeo==0.8.1"} <= pins  # fmt: skip


# ------------------------------------------------------------- the checker on a made-up tree


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\ndependencies = ["numpy>=1", "PyYAML", "ray[train]==2.60.0"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=8"]\n'
    )
    (tmp_path / "raytrain_hetero").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helper.py").write_text("")
    return tmp_path


DISTRIBUTIONS = {
    "numpy": ["numpy"], "yaml": ["PyYAML"], "ray": ["ray"], "pytest": ["pytest"],
    "scipy": ["scipy"], "PIL": ["Pillow"],
}  # fmt: skip


def test_declared_imports_pass(project):
    (project / "raytrain_hetero" / "m.py").write_text(
        "import os\nimport numpy as np\nimport yaml\nfrom ray.train import report\n"
        "from . import sibling\nfrom raytrain_hetero import m\n"
    )
    (project / "tests" / "test_m.py").write_text("import pytest\nimport helper\nimport m\n")
    assert undeclared_imports(project, distributions=DISTRIBUTIONS) == []


def test_undeclared_imports_are_named_with_file_and_line(project):
    (project / "raytrain_hetero" / "m.py").write_text(
        "import numpy\n\ndef f():\n    from scipy.ndimage import gaussian_filter\n"
    )
    (project / "tests" / "test_m.py").write_text("from PIL import Image\nimport notinstalled\n")
    problems = undeclared_imports(project, distributions=DISTRIBUTIONS)
    assert len(problems) == 3
    assert problems[0].startswith("raytrain_hetero/m.py:4: imports 'scipy' from ['scipy']")
    assert problems[1].startswith("tests/test_m.py:1: imports 'PIL' from ['pillow']")
    assert problems[2].startswith("tests/test_m.py:2: imports 'notinstalled', which is neither")


def test_package_imports_need_a_runtime_dependency(project):
    # pytest is declared in the test extra only: fine for tests, not for the package.
    (project / "raytrain_hetero" / "m.py").write_text("import pytest\n")
    (project / "tests" / "test_m.py").write_text("import pytest\n")
    problems = undeclared_imports(project, distributions=DISTRIBUTIONS)
    assert problems == [
        "raytrain_hetero/m.py:1: imports 'pytest' from ['pytest'], which [project] dependencies "
        "does not declare. Fix: add 'pytest' with a version range"
    ]


def test_package_may_import_a_feature_extra_only_inside_a_function(project):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + 'tracking = ["scipy>=1"]\n')
    lazy = "def f():\n    import scipy\n"
    (project / "raytrain_hetero" / "lazy.py").write_text(lazy)
    assert undeclared_imports(project, distributions=DISTRIBUTIONS) == []
    (project / "raytrain_hetero" / "eager.py").write_text("import scipy\n")
    problems = undeclared_imports(project, distributions=DISTRIBUTIONS)
    assert len(problems) == 1 and "of an optional extra at module level" in problems[0]


def test_uninstalled_but_declared_import_passes_through_its_alias(project):
    (project / "raytrain_hetero" / "m.py").write_text("import yaml\n")
    assert undeclared_imports(project, distributions={}) == []


def test_requirement_names():
    assert requirement_name("ray[default,train,tune]==2.60.0") == "ray"
    assert requirement_name("pydantic_core>=2") == "pydantic-core"
    assert requirement_name("PyYAML") == "pyyaml"
    assert requirement_name("h5py ; python_version>'3'") == "h5py"
