"""Pydantic validation errors -> one :class:`~raytrain_hetero.errors.ConfigError` with fixes.

Every problem becomes one line ``<source>: <key.path>: <what is wrong>. Fix: <how>.``; list
items appear as ``workers[1].device``. The raised error also carries the problems as
``err.problems`` (a tuple of :class:`ConfigProblem`). The YAML loader uses it with the file name
as source; library config objects built from Python use it with their class name.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
import reprlib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError

from raytrain_hetero.config.fields import BOOL_AS_NUMBER, INVALID, MULTI, Problem
from raytrain_hetero.errors import ConfigError, HeteroError

__all__ = [
    "ConfigProblem",
    "closest",
    "construct",
    "describe",
    "file_problem",
    "loc_path",
    "raise_if_any",
    "raise_problems",
    "raise_validation_error",
    "show",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    Attributes:
        source: The file (or other source) the config came from.
        path: Dotted key path, with list items as ``[i]`` (``""`` for the file itself).
        message: What is wrong (no trailing period).
        fix: How to fix it (no trailing period).
    """

    source: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.source}: {self.path}: " if self.path else f"{self.source}: "
        return f"{where}{self.message}. Fix: {self.fix}."


def raise_problems(problems: list[ConfigProblem], note: str = "") -> typing.NoReturn:
    """Raise one :class:`ConfigError` listing ``problems`` (kept as ``err.problems``)."""
    if len(problems) == 1:
        text = str(problems[0]) + note
    else:
        header = f"{len(problems)} problems in {problems[0].source}{note}:"
        text = "\n".join([header, *("  " + str(p) for p in problems)])
    err = ConfigError(text)
    err.problems = tuple(problems)  # type: ignore[attr-defined]  # survives pickling
    raise err from None


def raise_if_any(problems: list[Problem], source: str) -> None:
    """Raise one :class:`ConfigError` listing ``(location, message, fix)`` problems, if any."""
    if problems:
        raise_problems([ConfigProblem(source, loc_path(at), m, f) for at, m, f in problems])


def file_problem(source: str, message: str, fix: str) -> typing.NoReturn:
    """Raise a :class:`ConfigError` about ``source`` as a whole (no key path)."""
    raise_problems([ConfigProblem(source, "", message.rstrip("."), fix.rstrip("."))])


#: Words people write for a valid key or value: word -> candidates, first valid one wins.
_SYNONYMS: dict[str, str | tuple[str, ...]] = {
    "learning_rate": "lr",
    "learningrate": "lr",
    "batch_size": "global_batch_size",
    "batch": "global_batch_size",
    "num_epochs": "epochs",
    "n_epochs": "epochs",
    "epoch": "epochs",
    "wd": "weight_decay",
    "worker": "workers",
    "num_workers_per_group": "count",
    "replicas": "count",
    "num_replicas": "count",
    "slowdown": "emulated_slowdown",
    "gpu": ("cuda", "device"),
    "labels": "label_selector",
    "path": "root",
    "data_dir": "root",
    "dir": "root",
    "output": "output_dir",
    "out_dir": "output_dir",
    "outdir": "output_dir",
    "arch": "name",
    "architecture": "name",
    "shares": "fixed_shares",
    "weights": "weighting",
}


def construct(what: str, build: Callable[[], Any], fix: str) -> Any:
    """``build()``; any error the user's classes raise becomes one ConfigError naming ``what``.

    For the datasets, datamodules, tasks and models a job builds from user settings: their
    constructors raise anything, and a traceback through them names no setting to fix.
    """
    try:
        return build()
    except HeteroError:
        raise
    except Exception as exc:  # the user's (or torchgeo's) classes raise anything
        detail = " ".join(str(exc).split()).rstrip(".") or "(no message)"
        raise ConfigError(f"{what} failed: {type(exc).__name__}: {detail}. Fix: {fix}") from exc


def closest(key: str, candidates: Iterable[str]) -> str | None:
    """The valid key the user most likely meant, or ``None``."""
    cands = [c for c in candidates if isinstance(c, str)]
    low = {c.lower(): c for c in cands}
    k = key.lower().strip().replace("-", "_")
    if k in low:
        return low[k]
    synonyms = _SYNONYMS.get(k, ())
    for word in (synonyms,) if isinstance(synonyms, str) else synonyms:
        if word in cands:
            return word
    parts = [p for p in k.split("_") if p]
    if len(parts) > 1:
        acronym = "".join(p[0] for p in parts)
        if acronym in low:
            return low[acronym]
    match = difflib.get_close_matches(k, list(low), n=1, cutoff=0.6)
    if match:
        return low[match[0]]
    if len(k) >= 3:
        contained = [c for c in cands if k in c.lower() or (len(c) >= 3 and c.lower() in k)]
        if len(contained) == 1:
            return contained[0]
    return None


_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = 8
_repr.maxdict = 8


def show(value: Any) -> str:
    """A short YAML-flavoured rendering of a user-supplied value, with its type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    kind = {dict: "mapping", list: "list", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
    return f"{_repr.repr(value)} ({kind})"


def loc_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` from a type; ``None`` for other unions."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return None
            tp = args[0]
        else:
            return tp


def _field_types(tp: Any) -> dict[str, tuple[Any, str | None]] | None:
    """Field name -> (annotation, description) of a pydantic model or dataclass type."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {n: (f.annotation, f.description) for n, f in tp.model_fields.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {f.name: (hints.get(f.name), None) for f in dataclasses.fields(tp)}
    return None


def _model_at(root: Any, loc: Iterable[str | int]) -> dict[str, tuple[Any, str | None]] | None:
    """Fields of the model (or dataclass) that validates the mapping at ``loc`` under ``root``."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        fields = _field_types(tp)
        if fields is not None:
            if not isinstance(part, str) or part not in fields:
                return None
            tp = fields[part][0]
        elif typing.get_origin(tp) in (list, tuple) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return _field_types(_unwrap(tp))


_EXPECTED: dict[str, str] = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping (key: value)",
    "list_type": "a list",
    "path_type": "a path (string)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "none_required": "null",
}


def describe(
    err: Mapping[str, Any], source: str, root: Any, prefix: tuple[str | int, ...] = ()
) -> list[ConfigProblem]:
    """Turn one pydantic error dict (of ``ValidationError.errors()``) into
    :class:`ConfigProblem` s named ``source``; locations are relative to the validated ``root``
    class, with ``prefix`` (where ``root`` sits in the caller's terms) prepended.
    """
    etype: str = err["type"]
    loc = tuple(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    given = err.get("input")
    path = loc_path(loc)

    def problem(message: str, fix: str, at_loc: tuple = loc) -> ConfigProblem:
        return ConfigProblem(
            source,
            loc_path(prefix + tuple(at_loc)) or "(top level)",
            message.rstrip("."),
            fix.rstrip("."),
        )

    if etype == MULTI:
        return [problem(m, f, tuple(sub)) for sub, m, f in ctx["problems"]]
    if etype == INVALID:
        return [problem(ctx["message"], ctx["fix"], loc + tuple(ctx.get("at", ())))]
    if etype in ("extra_forbidden", "unexpected_keyword_argument"):
        key, parent = loc[-1], loc[:-1]
        fields = _model_at(root, parent)
        valid = list(fields) if fields is not None else []
        where = f"under '{loc_path(prefix + parent)}'" if prefix + parent else "at the top level"
        message = f"unknown key {str(key)!r} {where}"
        if valid:
            message += "; valid keys: " + ", ".join(valid)
        close = closest(str(key), valid) if valid else None
        fix = f"rename it to {close!r}" if close else "remove it (or correct its spelling)"
        return [problem(message, fix)]
    if etype == "missing":
        key, parent = loc[-1], loc[:-1]
        fields = _model_at(root, parent)
        desc = None
        if fields is not None and isinstance(key, str) and key in fields:
            desc = fields[key][1]
        where = f"under '{loc_path(prefix + parent)}'" if prefix + parent else "at the top level"
        fix = f"add '{key}' {where}" + (f" ({desc})" if desc else "")
        return [problem(f"required key {str(key)!r} is missing", fix)]
    if etype == BOOL_AS_NUMBER:
        expected = ctx.get("expected", "a number")
        return [problem(f"expected {expected}, got {show(given)}", f"write {expected} here")]
    if etype in _EXPECTED:
        expected = _EXPECTED[etype]
        if etype in ("model_type", "model_attributes_type"):
            fields = _model_at(root, loc)
            if fields is not None:
                expected += " with keys " + ", ".join(fields)
        fix = f"write {_EXPECTED[etype]} here"
        if etype == "string_type" and isinstance(given, (int, float, bool)):
            fix = f"quote it: '{given}'" if not isinstance(given, bool) else "quote it"
        if etype in ("model_type", "dict_type") and given is None:
            fix = "fill in the section, or remove the key to use the defaults"
        return [problem(f"expected {expected}, got {show(given)}", fix)]
    if etype == "literal_error":
        allowed = str(ctx.get("expected", ""))
        close = closest(str(given), re.findall(r"'([^']*)'", allowed))
        fix = f"use {close!r}" if close else f"use one of {allowed}"
        return [problem(f"must be one of {allowed}, got {show(given)}", fix)]
    bounds = {
        "greater_than": (">", "gt"),
        "greater_than_equal": (">=", "ge"),
        "less_than": ("<", "lt"),
        "less_than_equal": ("<=", "le"),
    }
    if etype in bounds:
        op, key = bounds[etype]
        limit = ctx.get(key)
        return [problem(f"must be {op} {limit}, got {show(given)}", f"use a value {op} {limit}")]
    if etype == "finite_number":
        return [problem(f"must be a finite number, got {show(given)}", "use a finite number")]
    if etype in ("too_short", "too_long"):
        lo, hi = ctx.get("min_length"), ctx.get("max_length")
        need = f"at least {lo}" if etype == "too_short" else f"at most {hi}"
        got = ctx.get("actual_length", "?")
        return [problem(f"needs {need} item(s), got {got}", f"give {need} item(s)")]
    if etype == "value_error" and isinstance(ctx.get("error"), ConfigError):
        # A plain dataclass (e.g. core's PolicyConfig) refused the values in __post_init__.
        return [problem(str(ctx["error"]), "use the valid values named above")]
    # Anything else: pydantic's own words, plus what was given.
    logger.debug("unmapped pydantic error type %s at %s", etype, path)
    return [problem(f"{err.get('msg', etype)}, got {show(given)}", "correct this value")]


def raise_validation_error(
    exc: ValidationError,
    root: Any,
    source: str | None = None,
    note: str = "",
    prefix: tuple[str | int, ...] = (),
) -> typing.NoReturn:
    """Raise one :class:`ConfigError` listing every problem of ``exc`` with its fix (arguments
    as :func:`describe`; ``source`` defaults to the class name, ``note`` adds to the first line).
    """
    where = source if source is not None else getattr(root, "__name__", str(root))
    problems = [p for e in exc.errors() for p in describe(e, where, root, prefix)]
    raise_problems(problems, note)
