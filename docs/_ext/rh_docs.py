"""Sphinx directives that generate reference pages from the code, so they cannot drift.

* ``.. config-reference::`` walks :class:`raytrain_hetero.app.config.JobConfig` (whose run
  sections ARE the library's config classes) and writes, per YAML section, one table row per
  field: its YAML key, type and constraints, default and the text of the class docstring's
  ``Attributes:`` entry. Library config classes that no YAML key reaches follow, under their
  Python names. A field without a docstring entry is a build warning (an error under ``-W``).
* ``.. cli-reference::`` renders ``raytrain-hetero`` and each subcommand from the argparse
  parser itself (:func:`raytrain_hetero.app.cli.build_parser`).
* The Python API reference (every public name by its public path, one page per area) is
  ``docs/_ext/rh_api.py``'s.

The generators are plain functions returning reStructuredText (used from ``.rst`` pages);
``tests/unit/test_docs.py`` calls them directly as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------ docstring attributes

_SECTION_RE = re.compile(r"^(\s*)(Attributes|Args|Arguments|Fields):\s*$")
_ENTRY_RE = re.compile(r"^(\w+)(?: \([^)]*\))?:\s*(.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> text of its entry in the ``Attributes:`` section of ``cls``'s docstring
    and of its bases' (the nearest class wins), continuation lines joined."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(_own_attribute_docs(klass))
    return docs


def _own_attribute_docs(cls: type) -> dict[str, str]:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    entries: dict[str, list[str]] = {}
    in_section = False
    section_indent = entry_indent = -1
    current: str | None = None
    for line in doc.splitlines():
        match = _SECTION_RE.match(line)
        if match and match.group(2) == "Attributes":
            in_section, section_indent, entry_indent, current = True, len(match.group(1)), -1, None
            continue
        if not in_section:
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= section_indent:
            in_section = False
            continue
        if entry_indent < 0:
            entry_indent = indent
        entry = _ENTRY_RE.match(line.strip())
        if indent == entry_indent and entry:
            current = entry.group(1)
            entries[current] = [entry.group(2)]
        elif current is not None:
            entries[current].append(line.strip())
    docs = {name: " ".join(part for part in text if part) for name, text in entries.items()}
    return _split_run_on(docs, set(_field_names(cls)))


def _split_run_on(docs: dict[str, str], names: set[str]) -> dict[str, str]:
    """``lr: SGD learning rate. momentum: SGD momentum.`` -> two entries (a docstring may
    describe short fields in one line)."""
    out: dict[str, str] = {}
    for name, text in docs.items():
        parts = re.split(r"(?<=\.)\s+(\w+):\s+", text)
        out[name] = parts[0]
        for i in range(1, len(parts) - 1, 2):
            if parts[i] in names and parts[i] not in docs:
                out[parts[i]] = parts[i + 1]
            else:
                out[name] += f" {parts[i]}: {parts[i + 1]}"
    return out


# ------------------------------------------------------------------------ config fields


@dataclass(frozen=True)
class FieldDoc:
    """One documented field of a config class."""

    name: str
    type: str
    default: str
    doc: str
    nested: tuple[tuple[str, type], ...] = ()  # (key suffix, config class) to document below


def _is_config_class(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp))


def _field_names(cls: type) -> list[str]:
    if hasattr(cls, "model_fields"):
        return list(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return []


def _constraints(metadata: list[Any]) -> list[str]:
    words = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "min length"}
    out = []
    for item in metadata:
        for attr, word in words.items():
            value = getattr(item, attr, None)
            if value is not None and not callable(value):
                out.append(f"{word} {value}")
    return out


def type_text(tp: Any) -> str:
    """A readable type: ``int ≥ 1``, ``"exact" | "local"``, ``list[WorkerSpec]``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        base, *metadata = args
        extra = _constraints(
            [m for item in metadata for m in (getattr(item, "metadata", None) or [item])]
        )
        return type_text(base) + (f" ({', '.join(extra)})" if extra else "")
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        shown = [type_text(a) for a in args if a is not Ellipsis]
        return f"{name}[{', '.join(shown)}{', ...' if Ellipsis in args else ''}]"
    if tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _nested_classes(tp: Any, suffix: str = "") -> Iterator[tuple[str, type]]:
    """Config classes reachable inside a field type, with the key suffix that reaches them
    (``[]`` for list items, ``.<key>`` for mapping values)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_config_class(tp):
        yield suffix, tp
    elif origin is typing.Annotated:
        yield from _nested_classes(args[0], suffix)
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _nested_classes(arg, suffix)
    elif origin in (list, tuple, set, frozenset):
        for arg in args:
            if arg is not Ellipsis:
                yield from _nested_classes(arg, suffix + "[]")
    elif origin is dict and len(args) == 2:
        yield from _nested_classes(args[1], suffix + ".<key>")


def _default_text(value: Any) -> str:
    if _is_config_class(type(value)):
        return f"{type(value).__name__}()"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        return f'"{value}"'
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "None"
    return repr(value)


def _section_text(nested: tuple[tuple[str, type], ...]) -> str:
    # A section field (``train:`` of the job) is documented by its class, in its own table.
    if len(nested) == 1:
        cls = nested[0][1]
        return f"{_class_summary(cls)} (:class:`{cls.__module__}.{cls.__qualname__}`: below)"
    return ""


def field_docs(cls: type) -> list[FieldDoc]:
    """Every field of a pydantic model or a dataclass, with type, default and docstring."""
    docs = attribute_docs(cls)
    out = []
    if hasattr(cls, "model_fields"):
        from pydantic_core import PydanticUndefined

        hints = typing.get_type_hints(cls, include_extras=True)
        for name, info in cls.model_fields.items():
            tp = hints.get(name, info.annotation)
            extra = _constraints(info.metadata)
            shown = type_text(tp) + (f" ({', '.join(extra)})" if extra else "")
            if info.default_factory is not None:
                default = _default_text(info.default_factory())  # type: ignore[call-arg]
            elif info.default is PydanticUndefined:
                default = "required"
            else:
                default = _default_text(info.default)
            nested = tuple(_nested_classes(tp))
            text = docs.get(name) or (info.description or "") or _section_text(nested)
            out.append(FieldDoc(name, shown, default, text, nested))
    else:
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = _default_text(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = _default_text(f.default_factory())
            else:
                default = "required"
            tp = hints.get(f.name, f.type)
            out.append(
                FieldDoc(
                    f.name, type_text(tp), default, docs.get(f.name, ""), tuple(_nested_classes(tp))
                )
            )
    return out


@dataclass
class ConfigSection:
    """One documented class at one place of the job file (or of the Python API)."""

    key: str  # "train", "scheduler.policy", "workers[]"; "" for Python-only classes
    cls: type
    fields: list[FieldDoc] = field(default_factory=list)


def walk_job_config() -> list[ConfigSection]:
    """Every config class of the YAML job, outermost first, with the key path reaching it."""
    from raytrain_hetero.app.config import JobConfig

    sections: list[ConfigSection] = []
    seen: set[tuple[str, type]] = set()

    def visit(key: str, cls: type) -> None:
        if (key, cls) in seen:
            return
        seen.add((key, cls))
        section = ConfigSection(key, cls, field_docs(cls))
        sections.append(section)
        for fd in section.fields:
            for suffix, nested in fd.nested:
                visit(f"{key}.{fd.name}{suffix}" if key else f"{fd.name}{suffix}", nested)

    visit("", JobConfig)
    return sections


def python_only_sections(covered: set[type]) -> list[ConfigSection]:
    """Library config classes (``raytrain_hetero.config.__all__``) no YAML key reaches."""
    import raytrain_hetero.config as config

    out = []
    for name in config.__all__:
        obj = getattr(config, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, config.HeteroModel)
            and obj is not config.HeteroModel
            and not any(issubclass(c, obj) for c in covered)
        ):
            if not _field_names(obj):
                continue
            out.append(ConfigSection("", obj, field_docs(obj)))
    return out


def _cell(text: str) -> str:
    return text.replace("\n", " ").strip() or "\\-"


def _literal(text: str) -> str:
    return "``" + text.replace("`", "'") + "``"


def _class_summary(cls: type) -> str:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def _table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 22 20 18 40",
        "",
        "   * - Key",
        "     - Type",
        "     - Default",
        "     - Description",
    ]
    for key, tp, default, doc in rows:
        lines += [f"   * - {key}", f"     - {tp}", f"     - {default}", f"     - {doc}"]
    return [*lines, ""]


def config_reference_rst() -> str:
    """The whole configuration reference as reStructuredText."""
    sections = walk_job_config()
    lines: list[str] = []
    for section in sections:
        cls = section.cls
        where = f"{cls.__module__}.{cls.__qualname__}"
        title = f"``{section.key}:``" if section.key else "Top level of a job file"
        lines += [title, "-" * (len(title) + 4), ""]
        lines += [f"*{cls.__name__}* (``{where}``): {_class_summary(cls)}", ""]
        rows = []
        for fd in section.fields:
            key = f"{section.key}.{fd.name}" if section.key else fd.name
            rows.append((_literal(key), _literal(fd.type), _literal(fd.default), _cell(fd.doc)))
        lines += _table(rows)
    covered = {s.cls for s in sections}
    extra = python_only_sections(covered)
    if extra:
        title = "Python-only config objects"
        lines += [title, "-" * len(title), ""]
        lines += ["Library config classes that no YAML key reaches (pass them from Python).", ""]
        for section in extra:
            cls = section.cls
            sub = f"``{cls.__name__}``"
            lines += [sub, "~" * len(sub), ""]
            lines += [f"``{cls.__module__}.{cls.__qualname__}``: {_class_summary(cls)}", ""]
            rows = [
                (_literal(fd.name), _literal(fd.type), _literal(fd.default), _cell(fd.doc))
                for fd in section.fields
            ]
            lines += _table(rows)
    return "\n".join(lines)


def undocumented_fields() -> list[str]:
    """``Class.field`` for every config field without docstring text."""
    sections = walk_job_config()
    sections += python_only_sections({s.cls for s in sections})
    return sorted(
        {f"{s.cls.__qualname__}.{fd.name}" for s in sections for fd in s.fields if not fd.doc}
    )


# ------------------------------------------------------------------------------ the CLI


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _options_rst(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        flags = ", ".join(action.option_strings) or action.metavar or action.dest
        if action.option_strings and action.nargs != 0:
            flags += f" {action.metavar or action.dest.upper()}"
        default = action.default
        if default in (None, [], False, argparse.SUPPRESS):
            shown_default = ""
        else:
            shown_default = str(default) if isinstance(default, Path) else repr(default)
        text = (action.help or "").replace("%(default)s", str(default))
        if action.nargs == "?" and not action.option_strings:
            flags = f"[{flags}]"
        rows.append((flags, shown_default, text))
    if not rows:
        return []
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 30 15 55",
        "",
        "   * - Argument",
        "     - Default",
        "     - Meaning",
    ]
    for flags, default, text in rows:
        lines += [
            f"   * - {_literal(flags)}",
            f"     - {_literal(default) if default else _EMPTY}",
            f"     - {_cell(_escape(text))}",
        ]
    return [*lines, ""]


_EMPTY = "\\-"


def _escape(text: str) -> str:
    return re.sub(r"([*`|_\\])", r"\\\1", text)


def cli_reference_rst() -> str:
    """``raytrain-hetero`` and every subcommand as reStructuredText."""
    from raytrain_hetero.app.cli import build_parser

    parser = build_parser()
    lines = [parser.description or "", "", ".. code-block:: text", ""]
    lines += ["   " + ln for ln in parser.format_usage().strip().splitlines()] + [""]
    lines += _options_rst(parser)
    helps = _subcommand_help(parser)
    for name, sub in _subcommands(parser).items():
        title = f"``raytrain-hetero {name}``"
        lines += [title, "-" * len(title), "", _escape(helps.get(name, "")), ""]
        lines += [".. code-block:: text", ""]
        lines += ["   " + ln for ln in sub.format_usage().strip().splitlines()] + [""]
        lines += _options_rst(sub)
    return "\n".join(lines)


# --------------------------------------------------------------------------- directives


class _GeneratedRst(SphinxDirective):
    """Parse generated reStructuredText in place (titles allowed)."""

    has_content = False
    generate: Callable[[], str]

    def run(self) -> list[nodes.Node]:
        text = type(self).generate()
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(text.splitlines(), "<rh_docs>"), node)
        return list(node.children)


class ConfigReference(_GeneratedRst):
    generate = staticmethod(config_reference_rst)

    def run(self) -> list[nodes.Node]:
        for name in undocumented_fields():
            logger.warning(
                "config field %s has no docstring entry (add it to the class's Attributes:)",
                name,
                location=(self.env.docname, self.lineno),
            )
        return super().run()


class CliReference(_GeneratedRst):
    generate = staticmethod(cli_reference_rst)


# ------------------------------------------------------------- references into the code


def _importable(dotted: str) -> bool:
    """Whether ``raytrain_hetero.a.b.C.meth`` names a real module, class, function or
    attribute (modules imported, then attributes followed)."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if isinstance(obj, type) and attr in getattr(obj, "model_fields", {}):
                return True  # a pydantic field: no class attribute, but real
            if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
                return True
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _missing_reference(
    app: Sphinx, env: Any, node: Any, contnode: nodes.Element
) -> nodes.Element | None:
    """A Python cross-reference with no documented target (``nitpicky`` is on).

    A ``raytrain_hetero.*`` target that exists in the code renders as plain code (not every
    module has a page); one that does not (a renamed or removed name) is left to warn, which
    fails the ``-W`` build. Third-party targets (torch, ray, typing) are not checked here.
    """
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith("raytrain_hetero"):
        return contnode
    return contnode if _importable(target) else None


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", _missing_reference)
    app.add_directive("config-reference", ConfigReference)
    app.add_directive("cli-reference", CliReference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
