"""Reading and writing job files: a strict YAML loader, :func:`load_config`, :func:`dump_config`.

:func:`load_config` turns *every* problem (a missing file, bad YAML, duplicate keys, any
invalid value) into one :class:`~raytrain_hetero.errors.ConfigError` whose message lists each
problem on its own line as ``<file>: <key.path>: <what is wrong>. Fix: <how to fix it>``
(see :mod:`raytrain_hetero.config.problems`). Command-line overrides are merged over the
file's content before validation (:mod:`raytrain_hetero.app.overrides`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raytrain_hetero.app.overrides import merge_overrides
from raytrain_hetero.app.schema import JobConfig
from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.config.fields import absolute
from raytrain_hetero.config.problems import file_problem, raise_validation_error, show

__all__ = ["dump_config", "load_config", "validate_config"]

logger = logging.getLogger(__name__)


def validate_config(data: Mapping[str, Any], source: str = "<config>", note: str = "") -> JobConfig:
    """Validate a plain mapping (overrides already merged) into a :class:`JobConfig`.

    ``source`` names the ``<file>`` of each problem, ``note`` adds to the error's first line.

    Raises:
        ConfigError: One error listing every problem found.
    """
    if not isinstance(data, Mapping):
        file_problem(
            source,
            f"the top level must be a mapping (key: value), got {show(data)}",
            "start the file with keys such as name:, data:, workers:",
        )
    try:
        return JobConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise_validation_error(exc, JobConfig, source=source, note=note)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem


def load_config(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
) -> JobConfig:
    """Read a YAML job file, merge ``overrides`` (a nested mapping, see
    :func:`parse_overrides`; list items by index keys) over it, validate it.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML or not a mapping, or any value
            is invalid; the message lists every problem with its fix.
    """
    source = str(path)
    p = Path(path)
    if not p.exists():
        file_problem(
            source,
            f"config file not found (looked at {absolute(p)})",
            "check the path; example configs live in examples/configs/",
        )
    if not p.is_file():
        file_problem(source, "is not a file", "pass the path of a YAML config file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        file_problem(source, f"cannot be read: {exc}", "check the file's permissions and encoding")
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        duplicate = "duplicate key" in str(getattr(exc, "problem", ""))
        file_problem(
            source,
            f"is not valid YAML: {_yaml_error_text(exc)}",
            "keep only one of the duplicate keys"
            if duplicate
            else "correct the YAML syntax there (indentation, colons, quotes)",
        )
    if data is None:
        file_problem(source, "is empty", "add at least data: and workers: sections")
    note = ""
    if overrides and isinstance(data, Mapping):
        data = merge_overrides(data, overrides, source=source)
        note = " (after overrides: " + ", ".join(_flat_keys(overrides)) + ")"
    cfg = validate_config(data, source=source, note=note)
    logger.debug("loaded config %s (%d workers)", source, cfg.total_workers)
    return cfg


def _flat_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for k, v in tree.items():
        full = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            keys.extend(_flat_keys(v, full))
        else:
            keys.append(full)
    return keys


def dump_config(cfg: JobConfig, path: str | os.PathLike[str]) -> Path:
    """Write ``cfg`` as YAML (paths absolute as resolved), atomically; return the path.

    The file loads back with :func:`load_config` into an equal :class:`JobConfig`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return target
