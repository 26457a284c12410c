"""The package's layer rules and the absence of import cycles, checked from source text.

Arrows point down only: app -> driver/tune/inference -> worker -> core, with errors, atomic
and the library config objects underneath everything but core. Every import statement of
every module of ``raytrain_hetero`` is read with :mod:`ast` (nothing is imported or run):

* the layer rules count every import, also the lazy ones inside functions and those under
  ``if TYPE_CHECKING:`` (a lazy import of the driver is still a dependency on it);
* the cycle check counts every import too: a circle closed only by a lazy or a type-only import
  cannot fail at import time, but it is a circle of the design all the same (two modules that
  each need the other to be understood);
* the layer order (:data:`LAYER_ORDER`, the one of ``../shared/tools/check_import_cycles.py``)
  forbids every import of a higher layer, and inside ``worker/`` the sub-packages point down
  their own order (:data:`WORKER_ORDER`);
* no module is over :data:`MAX_MODULE_LINES` lines.

Each failure names the importing file, the line and the rule it breaks.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "raytrain_hetero"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE

# The root package (a lazy facade over the public names) and ``python -m raytrain_hetero``
# (the CLI entry point) sit above every layer.
ENTRY_POINTS = frozenset({"root", "__main__"})


@dataclass(frozen=True)
class LayerRule:
    """Which package layers the modules of some layers may import.

    Attributes:
        text: The rule in words, as a failure reports it.
        importers: Layers the rule applies to (``"root"`` is the package ``__init__``).
        allowed: If set, the only layers they may import (their own layer always allowed).
        forbidden: Layers they must never import.
    """

    text: str
    importers: frozenset[str]
    allowed: frozenset[str] | None = None
    forbidden: frozenset[str] = frozenset()

    def breaks(self, importer_layer: str, target_layer: str) -> bool:
        """Whether an import from ``importer_layer`` of ``target_layer`` breaks the rule."""
        if importer_layer not in self.importers or target_layer == importer_layer:
            return False
        if self.allowed is not None and target_layer not in self.allowed:
            return True
        return target_layer in self.forbidden


ALL_LAYERS = frozenset(
    {"root", "__main__", "errors", "atomic", "config", "core", "worker", "parallel", "driver",
     "tune", "inference", "sim", "workloads", "app", "storage"}
)  # fmt: skip

RULES: tuple[LayerRule, ...] = (
    LayerRule(
        "core is pure: it imports only raytrain_hetero.errors and core itself",
        importers=frozenset({"core"}),
        allowed=frozenset({"errors"}),
    ),
    LayerRule(
        "errors, atomic and config (library config objects) import nothing above core",
        importers=frozenset({"errors", "atomic", "config"}),
        allowed=frozenset({"core", "errors", "atomic"}),
    ),
    LayerRule(
        "storage (the one storage helper) imports only errors, atomic and config",
        importers=frozenset({"storage"}),
        allowed=frozenset({"errors", "atomic", "config"}),
    ),
    LayerRule(
        "errors is the leaf: it imports nothing of the package",
        importers=frozenset({"errors"}),
        allowed=frozenset(),
    ),
    LayerRule(
        "worker never imports parallel, driver, app, tune, inference or sim",
        importers=frozenset({"worker"}),
        forbidden=frozenset({"parallel", "driver", "app", "tune", "inference", "sim"}),
    ),
    LayerRule(
        "parallel imports core, config, errors, atomic, worker and workloads; never driver, "
        "app, tune, inference or sim",
        importers=frozenset({"parallel"}),
        allowed=frozenset({"core", "config", "errors", "atomic", "worker", "workloads"}),
    ),
    LayerRule(
        "driver never imports app, tune or inference",
        importers=frozenset({"driver"}),
        forbidden=frozenset({"app", "tune", "inference"}),
    ),
    LayerRule(
        "tune and inference never import app",
        importers=frozenset({"tune", "inference"}),
        forbidden=frozenset({"app"}),
    ),
    LayerRule(
        "workloads import only core, errors, atomic and config of the package",
        importers=frozenset({"workloads"}),
        allowed=frozenset({"core", "errors", "atomic", "config"}),
    ),
    LayerRule(
        "nothing but app imports app (the YAML schema lives there)",
        importers=ALL_LAYERS - {"app"} - ENTRY_POINTS,
        forbidden=frozenset({"app"}),
    ),
)

# Violations present in the tree while the redesign lands in parallel branches, as
# (importing module, imported module). The lead empties this set after merging; an entry that
# no longer occurs fails test_known_violations_still_occur, so the list cannot rot.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()
# Import cycles present in the tree, each as the sorted tuple of its modules (same rules).
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()


@dataclass(frozen=True)
class ImportEdge:
    """One import of a package module by a package module.

    Attributes:
        importer: Dotted name of the importing module.
        path: File of the importing module.
        line: Line of the import statement.
        target: Dotted name of the imported module (the submodule where one is named).
        at_import_time: Whether it runs when the importer is imported (module or class body,
            outside ``if TYPE_CHECKING:``), as opposed to inside a function.
    """

    importer: str
    path: Path
    line: int
    target: str
    at_import_time: bool

    def where(self) -> str:
        """``file:line`` of the import, relative to the repository when possible."""
        try:
            shown = self.path.relative_to(PACKAGE_DIR.parent)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under ``package_dir``: dotted name -> file."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def layer_of(module: str) -> str:
    """The layer of a dotted module name: its first component below the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time."""

    def visit(
        node: ast.AST, at_import_time: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, at_import_time
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), at_import_time)
            else:
                yield from visit(child, at_import_time)

    yield from visit(tree, True)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[ImportEdge]:
    """The imports of package modules made by ``module`` (read from ``path``); ``modules`` is
    every module of the package, by dotted name."""
    package_name = module.split(".")[0]
    is_package = path.name == "__init__.py"
    edges = []
    for node, at_import_time in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: resolve against the importer's package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub`` imports the submodule when there is one.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        for target in targets:
            if target != package_name and not target.startswith(package_name + "."):
                continue
            # ``import pkg.a.b`` names module pkg.a.b; keep the longest prefix that is a module.
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            edges.append(ImportEdge(module, path, node.lineno, target, at_import_time))
    return list(dict.fromkeys(edges))  # ``from x import a, b`` is one import of x


def all_imports(package_dir: Path) -> list[ImportEdge]:
    """Every package-internal import of every module under ``package_dir``."""
    modules = package_modules(package_dir)
    return [edge for name, path in modules.items() for edge in imports_of(name, path, modules)]


#: Top-level packages of the repository that sit above the library and are not in the wheel:
#: the project's benchmark suite imports raytrain_hetero, never the other way round.
ABOVE_THE_LIBRARY = ("benchmarks",)


def imports_from_above(package_dir: Path, above: tuple[str, ...] = ABOVE_THE_LIBRARY) -> list[str]:
    """``file:line: module imports name`` for every import (lazy ones and those under
    ``TYPE_CHECKING`` included) of a package in ``above`` by a module under ``package_dir``."""
    found = []
    for module, path in package_modules(package_dir).items():
        for node, _ in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module or ""] if node.level == 0 else []
            for name in names:
                if name.split(".")[0] in above:
                    shown = path.relative_to(package_dir.parent)
                    found.append(f"{shown}:{node.lineno}: {module} imports {name}")
    return found


def layer_violations(edges: list[ImportEdge]) -> list[tuple[ImportEdge, LayerRule]]:
    """Each import that breaks a layer rule, with the (first) rule it breaks."""
    found = []
    for edge in edges:
        for rule in RULES:
            if rule.breaks(layer_of(edge.importer), layer_of(edge.target)):
                found.append((edge, rule))
                break
    return found


def import_cycles(
    edges: list[ImportEdge], *, import_time_only: bool = False
) -> list[list[ImportEdge]]:
    """The import cycles: for each strongly connected component of more than one module (or a
    module importing itself), one cycle through it as a list of edges. Every import counts
    (lazy and type-only ones too) unless ``import_time_only``. An import of a package by one of
    its own modules (``from pkg import sub`` naming the package) is no edge: a package's
    ``__init__`` runs before its modules in any case."""
    graph: dict[str, dict[str, ImportEdge]] = {}
    for edge in edges:
        if import_time_only and not edge.at_import_time:
            continue
        if edge.importer.startswith(edge.target + "."):
            continue
        graph.setdefault(edge.importer, {}).setdefault(edge.target, edge)
    # Tarjan's strongly connected components, iteratively (no recursion limit on deep trees).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, {}):
                    components.append(sorted(component))
    cycles = []
    for component in components:
        members = set(component)
        # Walk from the first member along edges inside the component until a module repeats.
        path = [component[0]]
        while True:
            nxt = next(t for t in sorted(graph[path[-1]]) if t in members)
            if nxt in path:
                path = [*path[path.index(nxt) :], nxt]
                break
            path.append(nxt)
        cycles.append([graph[a][b] for a, b in itertools.pairwise(path)])
    return cycles


#: The layers from the bottom up, as ``../shared/tools/check_import_cycles.py`` orders them: a
#: module never imports a layer listed after its own (layers not listed are ruled by RULES).
LAYER_ORDER = (
    "errors", "atomic", "core", "config", "sim", "worker", "workloads", "storage", "parallel",
    "driver", "inference", "tune", "app",
)  # fmt: skip

#: ``worker/``'s sub-packages from the bottom up (``raytrain_hetero/worker/__init__.py`` says
#: what each holds); a sub-package never imports one listed after it. The public worker API
#: (``worker/api.py``, ``worker/lightning.py``) sits above them all.
WORKER_ORDER = ("setup", "measure", "sync", "data", "state", "plan", "runtime")
WORKER_TOP = frozenset({"api", "lightning"})

#: The house rule for a module's length: past it, a module holds more than one concern.
MAX_MODULE_LINES = 600


def upward_imports(edges: list[ImportEdge]) -> list[ImportEdge]:
    """Each import of a layer higher in :data:`LAYER_ORDER` than the importer's."""
    rank = {layer: i for i, layer in enumerate(LAYER_ORDER)}
    return [
        edge
        for edge in edges
        if layer_of(edge.importer) in rank
        and layer_of(edge.target) in rank
        and rank[layer_of(edge.target)] > rank[layer_of(edge.importer)]
    ]


def _worker_part(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "worker":
        return None
    return parts[2]


def worker_upward_imports(edges: list[ImportEdge]) -> list[ImportEdge]:
    """Each import by a worker module of a worker sub-package later in :data:`WORKER_ORDER`
    (or of the public worker API) than its own."""
    rank = {part: i for i, part in enumerate(WORKER_ORDER)}
    rank.update({part: len(WORKER_ORDER) for part in WORKER_TOP})
    found = []
    for edge in edges:
        mine, theirs = _worker_part(edge.importer), _worker_part(edge.target)
        if mine is None or theirs is None or mine == theirs:
            continue
        if rank.get(theirs, -1) > rank.get(mine, len(WORKER_ORDER)):
            found.append(edge)
    return found


def _cycle_key(cycle: list[ImportEdge]) -> tuple[str, ...]:
    return tuple(sorted({edge.importer for edge in cycle}))


def _describe(cycle: list[ImportEdge]) -> str:
    return "\n".join(f"  {e.where()}: {e.importer} imports {e.target}" for e in cycle)


# ------------------------------------------------------------------------------ the tree


@pytest.fixture(scope="module")
def tree_imports() -> list[ImportEdge]:
    return all_imports(PACKAGE_DIR)


def test_the_checker_sees_the_package(tree_imports):
    modules = package_modules(PACKAGE_DIR)
    assert "raytrain_hetero.core.allocation" in modules
    assert {layer_of(m) for m in modules} <= ALL_LAYERS, (
        f"unknown layer(s) {sorted({layer_of(m) for m in modules} - ALL_LAYERS)}: give each new "
        "top-level module or subpackage a place in the layer rules of this test"
    )
    assert any(e.target == "raytrain_hetero.errors" for e in tree_imports)


def test_layer_rules(tree_imports):
    broken = [
        f"{edge.where()}: {edge.importer} imports {edge.target}; rule: {rule.text}"
        for edge, rule in layer_violations(tree_imports)
        if (edge.importer, edge.target) not in KNOWN_VIOLATIONS
    ]
    assert not broken, "layer rules broken:\n" + "\n".join(broken)


def test_known_violations_still_occur(tree_imports):
    present = {(edge.importer, edge.target) for edge, _ in layer_violations(tree_imports)}
    gone = sorted(KNOWN_VIOLATIONS - present)
    assert not gone, f"fixed, so remove from KNOWN_VIOLATIONS in {Path(__file__).name}: {gone}"


def test_no_import_cycles(tree_imports):
    cycles = [c for c in import_cycles(tree_imports) if _cycle_key(c) not in KNOWN_CYCLES]
    assert not cycles, "import cycles (imports that run at import time):\n" + "\n\n".join(
        _describe(c) for c in cycles
    )


def test_no_upward_imports(tree_imports):
    found = [
        f"{edge.where()}: {edge.importer} imports {edge.target} (layer order: "
        f"{' < '.join(LAYER_ORDER)})"
        for edge in upward_imports(tree_imports)
    ]
    assert not found, "imports up the layers:\n" + "\n".join(found)


def test_worker_subpackages_point_down(tree_imports):
    modules = package_modules(PACKAGE_DIR)
    parts = {_worker_part(m) for m in modules} - {None, "__init__"}
    known = set(WORKER_ORDER) | WORKER_TOP
    assert parts <= known, (
        f"worker/ has {sorted(parts - known)} outside WORKER_ORDER: give each sub-package its "
        "place in the order (and in raytrain_hetero/worker/__init__.py's map)"
    )
    found = [
        f"{edge.where()}: {edge.importer} imports {edge.target} (worker order: "
        f"{' < '.join(WORKER_ORDER)} < api/lightning)"
        for edge in worker_upward_imports(tree_imports)
    ]
    assert not found, "worker sub-packages importing up:\n" + "\n".join(found)


def test_no_module_over_the_size_rule():
    long = {
        str(path.relative_to(PACKAGE_DIR.parent)): lines
        for path in package_modules(PACKAGE_DIR).values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split each along its seams): {long}"


def test_known_cycles_still_occur(tree_imports):
    present = {_cycle_key(c) for c in import_cycles(tree_imports)}
    gone = sorted(KNOWN_CYCLES - present)
    assert not gone, f"fixed, so remove from KNOWN_CYCLES in {Path(__file__).name}: {gone}"


def test_the_library_never_imports_the_benchmarks():
    # benchmarks/ is not in the wheel: such an import would fail on every user's machine.
    found = imports_from_above(PACKAGE_DIR)
    assert not found, "the wheel must not import the repository's benchmarks:\n" + "\n".join(found)


# ------------------------------------------------------------- the checker on a made-up tree


def _write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_checker_finds_each_kind_of_violation(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "core/__init__.py": "",
            "core/a.py": "from pkg.errors import E\nfrom . import b\n",
            "core/b.py": "import pkg.worker.api\n",  # core -> worker
            "worker/__init__.py": "",
            "worker/api.py": "def f():\n    from ..driver import trainer\n",  # lazy, still counted
            "driver/__init__.py": "",
            "driver/trainer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.app import config\n",
            "app/__init__.py": "",
            "app/config.py": "",
            "workloads/__init__.py": "",
            "workloads/data.py": "from pkg.driver.trainer import T\n",
        },
    )
    found = {
        (e.importer, e.target, e.line, rule.text.split(" ")[0])
        for e, rule in layer_violations(all_imports(package))
    }
    assert found == {
        ("pkg.core.b", "pkg.worker.api", 1, "core"),
        ("pkg.worker.api", "pkg.driver.trainer", 2, "worker"),
        ("pkg.driver.trainer", "pkg.app.config", 3, "driver"),
        ("pkg.workloads.data", "pkg.driver.trainer", 1, "workloads"),
    }


def test_checker_finds_cycles_lazy_and_type_only_ones_included(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "worker/__init__.py": "",
            "worker/a.py": "from pkg.worker import b\n",
            "worker/b.py": "class K:\n    from pkg.worker.c import x\n",  # class body: import time
            "worker/c.py": "import pkg.worker.a\n",
            "worker/d.py": "from pkg.worker import e\n",
            "worker/e.py": "def f():\n    from pkg.worker import d\n",  # lazy: still a circle
            "worker/t.py": "from pkg.worker import u\n",
            "worker/u.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.worker.t import T\n",  # type-only: still a circle
            "worker/s.py": "from . import s\n",  # imports itself
            "worker/sub/__init__.py": "",
            "worker/sub/m.py": "from pkg.worker import sub\n",  # its own package: no edge
        },
    )
    edges = all_imports(package)
    assert sorted(_cycle_key(c) for c in import_cycles(edges)) == [
        ("pkg.worker.a", "pkg.worker.b", "pkg.worker.c"),
        ("pkg.worker.d", "pkg.worker.e"),
        ("pkg.worker.s",),
        ("pkg.worker.t", "pkg.worker.u"),
    ]
    cycles = import_cycles(edges, import_time_only=True)
    assert sorted(_cycle_key(c) for c in cycles) == [
        ("pkg.worker.a", "pkg.worker.b", "pkg.worker.c"),
        ("pkg.worker.s",),
    ]
    three = next(c for c in cycles if len(c) == 3)
    assert [(e.importer, e.target) for e in three] == [
        ("pkg.worker.a", "pkg.worker.b"),
        ("pkg.worker.b", "pkg.worker.c"),
        ("pkg.worker.c", "pkg.worker.a"),
    ]
    assert "worker/c.py:1: pkg.worker.c imports pkg.worker.a" in _describe(three)


def test_checker_finds_upward_imports(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "storage.py": "",
            "worker/__init__.py": "",
            "worker/setup/__init__.py": "",
            "worker/setup/identity.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.storage import Location\n",  # type-only, still up the layers
            "worker/data/__init__.py": "",
            "worker/data/sampler.py": "def f():\n    from pkg.worker.plan import planning\n",
            "worker/plan/__init__.py": "",
            "worker/plan/planning.py": "from pkg.worker.data.sampler import S\n",  # down: fine
            "worker/api.py": "from pkg.worker.plan.planning import P\n",  # the top: fine
            "worker/runtime/__init__.py": "",
            "worker/runtime/registry.py": "from pkg.worker import api\n",  # up to the API
        },
    )
    edges = all_imports(package)
    assert {(e.importer, e.target) for e in upward_imports(edges)} == {
        ("pkg.worker.setup.identity", "pkg.storage")
    }
    assert {(e.importer, e.target) for e in worker_upward_imports(edges)} == {
        ("pkg.worker.data.sampler", "pkg.worker.plan.planning"),
        ("pkg.worker.runtime.registry", "pkg.worker.api"),
    }


def test_checker_finds_imports_of_the_benchmarks(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "app/__init__.py": "def f():\n    import benchmarks.suite\n",  # lazy, still counted
            "app/cli.py": "from benchmarks import runner\nfrom . import benchmarks_view\n",
            "app/benchmarks_view.py": "import benchmarksuite\n",  # another package's name
        },
    )
    assert imports_from_above(package) == [
        "pkg/app/__init__.py:2: pkg.app imports benchmarks.suite",
        "pkg/app/cli.py:1: pkg.app.cli imports benchmarks",
    ]


def test_module_names_resolve_like_python(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "from .core import plan\n",
            "core/__init__.py": "from .plan import P\nfrom .. import errors\n",
            "core/plan.py": "from .allocation import f\nimport pkg.core.allocation as al\n",
            "core/allocation.py": "from pkg.core import nothing_module\n",
            "errors.py": "",
        },
    )
    got = {(e.importer, e.target) for e in all_imports(package)}
    assert got == {
        ("pkg", "pkg.core.plan"),
        ("pkg.core", "pkg.core.plan"),
        ("pkg.core", "pkg.errors"),
        ("pkg.core.plan", "pkg.core.allocation"),
        ("pkg.core.allocation", "pkg.core"),  # a name, not a module: the package itself
    }
    assert sys.modules.get("pkg") is None  # read, never imported
