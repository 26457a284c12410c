"""The Python API reference by public path: one page per area, each name as users import it.

Users write ``import raytrain_hetero as rh`` and ``rh.HeteroTrainer``, ``rh.prepare_model``,
``rh.lightning.HeteroDDPStrategy``; where a name is defined (``raytrain_hetero.driver.
trainer``, ``raytrain_hetero.worker.api``) is an implementation detail that moves. So every
name of ``raytrain_hetero.__all__`` is documented under ``raytrain_hetero.<name>``, on the
page of its area (:data:`API_AREAS`):

* ``.. public-api:: AREA`` (on the area's page under ``docs/reference/api/``): a summary
  table of the area's names (each linked to its entry, with the first line of its
  docstring), then one autodoc entry per name;
* ``.. public-api-index::`` (on ``docs/reference/api.rst``): every area with its names;
* a cross-reference to a public object by its defining path (``:class:`~raytrain_hetero.
  driver.trainer.HeteroTrainer``` in a docstring, a type hint) resolves to its public entry.

A public name that fits no area, or an area without its page, fails the build or
``tests/unit/test_docs.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

PACKAGE = "raytrain_hetero"


@dataclass(frozen=True)
class ApiArea:
    """One page of the API reference: the public names whose definition ``matches``."""

    page: str  # docs/reference/api/<page>.rst
    title: str
    matches: Callable[[str, Any], bool]  # (defining module, object)


def _defined_in(*prefixes: str) -> Callable[[str, Any], bool]:
    return lambda module, obj: module.startswith(tuple(f"{PACKAGE}.{p}" for p in prefixes))


#: The areas, in the order the index lists them. A name goes to the first area it matches.
API_AREAS: list[ApiArea] = [
    ApiArea("trainer", "The trainer", _defined_in("driver")),
    ApiArea("lightning", "Lightning", lambda module, obj: inspect.ismodule(obj)),
    ApiArea("batchnorm", "BatchNorm layers", lambda module, obj: "batchnorm" in module),
    ApiArea("train-loop", "Inside the train loop", _defined_in("worker")),
    ApiArea("configuration", "Configuration objects", _defined_in("config", "app", "core")),
    ApiArea("model-parallelism", "Model parallelism", _defined_in("parallel")),
    ApiArea("errors", "Errors", _defined_in("errors")),
]

#: Classes documented with their public methods.
WITH_MEMBERS = {"HeteroTrainer", "ParallelModel", "ParallelLayout"}


@dataclass(frozen=True)
class ApiEntry:
    """One public name: ``raytrain_hetero.<name>``."""

    name: str
    module: str  # where it is defined (for the record; the docs show the public path)
    kind: str  # autodoc directive: autoclass, autoexception, autofunction, automodule

    @property
    def path(self) -> str:
        return f"{PACKAGE}.{self.name}"


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "automodule"
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    return "autofunction"


def public_api() -> dict[str, list[ApiEntry]]:
    """Area page -> its public names (``raytrain_hetero.__all__`` order).

    Raises:
        ValueError: A public name fits no area (add one to :data:`API_AREAS`).
    """
    import raytrain_hetero as rh

    areas: dict[str, list[ApiEntry]] = {area.page: [] for area in API_AREAS}
    for name in rh.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(rh, name)
        module = obj.__name__ if inspect.ismodule(obj) else obj.__module__
        for area in API_AREAS:
            if area.matches(module, obj):
                areas[area.page].append(ApiEntry(name, module, _kind(obj)))
                break
        else:
            raise ValueError(f"{PACKAGE}.{name} ({module}) fits no area of rh_api.API_AREAS")
    return areas


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    # A paragraph that introduces a code block ends in "::": one colon without the block.
    return first.removesuffix("::") + (":" if first.endswith("::") else "") or "\\-"


def _role(entry: ApiEntry) -> str:
    return {
        "automodule": "mod",
        "autoclass": "class",
        "autoexception": "exc",
        "autofunction": "func",
    }[entry.kind]


def _summary_table(entries: list[ApiEntry], with_area: bool = False) -> list[str]:
    import raytrain_hetero as rh

    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", ""]
    lines += ["   * - Name", "     - Summary"]
    for entry in entries:
        link = f":{_role(entry)}:`~{entry.path}`"
        lines += [f"   * - {link}", f"     - {_summary(getattr(rh, entry.name))}"]
    return [*lines, ""]


def area_rst(page: str) -> str:
    """The summary table and the autodoc entries of one area."""
    entries = public_api()[page]
    lines = _summary_table(entries)
    for entry in entries:
        lines += [f".. {entry.kind}:: {entry.path}"]
        if entry.kind == "automodule" or entry.name in WITH_MEMBERS:
            lines += ["   :members:"]
        lines += [""]
    return "\n".join(lines)


def index_rst() -> str:
    """Every area (linked to its page) with its names."""
    lines: list[str] = []
    for area in API_AREAS:
        entries = public_api()[area.page]
        if not entries:
            continue
        names = ", ".join(f":{_role(e)}:`~{e.path}`" for e in entries)
        lines += [f"* :doc:`api/{area.page}`: {names}"]
    return "\n".join([*lines, ""])


class _Generated(SphinxDirective):
    """Parse generated reStructuredText in place."""

    def _parse(self, text: str) -> list[nodes.Node]:
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(text.splitlines(), "<rh_api>"), node)
        return list(node.children)


class PublicApi(_Generated):
    """``.. public-api:: AREA``: the area's table and entries."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        page = self.arguments[0]
        if page not in {area.page for area in API_AREAS}:
            raise self.error(
                f"public-api: no area {page!r}; the areas: {[a.page for a in API_AREAS]}"
            )
        return self._parse(area_rst(page))


class PublicApiIndex(_Generated):
    """``.. public-api-index::``: every area with its names."""

    def run(self) -> list[nodes.Node]:
        return self._parse(index_rst())


# ------------------------------------------------ internal paths resolve to public entries


def public_paths() -> dict[int, str]:
    """``id(object)`` -> its public path, for every public name (and ``rh.lightning``'s)."""
    import raytrain_hetero as rh

    out: dict[int, str] = {}
    for name in rh.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(rh, name)
        out.setdefault(id(obj), f"{PACKAGE}.{name}")
        if inspect.ismodule(obj):
            for member in getattr(obj, "__all__", []):
                out.setdefault(id(getattr(obj, member)), f"{PACKAGE}.{name}.{member}")
    return out


def public_target(target: str) -> str | None:
    """The public path of an internal one (``raytrain_hetero.driver.trainer.HeteroTrainer.fit``
    -> ``raytrain_hetero.HeteroTrainer.fit``), or None when no prefix of it is public."""
    import importlib

    parts = target.split(".")
    paths = public_paths()
    for i in range(len(parts), 1, -1):
        module_name, attrs = None, parts[:i]
        obj: Any = None
        for j in range(len(attrs), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(attrs[:j]))
            except ImportError:
                continue
            module_name = ".".join(attrs[:j])
            for attr in attrs[j:]:
                obj = getattr(obj, attr, None)
            break
        if module_name is None or obj is None:
            continue
        public = paths.get(id(obj))
        if public is not None and public != ".".join(parts[:i]):
            return ".".join([public, *parts[i:]])
    return None


def _resolve_to_public(
    app: Sphinx, env: Any, node: Any, contnode: nodes.Element
) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith(f"{PACKAGE}."):
        return None
    public = public_target(target)
    if public is None:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], public, node, contnode
    )


def setup(app: Sphinx) -> dict[str, Any]:
    # Before rh_docs' handler, which renders any existing internal target as plain code.
    app.connect("missing-reference", _resolve_to_public, priority=400)
    app.add_directive("public-api", PublicApi)
    app.add_directive("public-api-index", PublicApiIndex)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
