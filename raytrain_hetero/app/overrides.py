"""Command-line overrides (``--set train.epochs=1``), parsed and merged by OmegaConf.

Values are parsed by OmegaConf's dotlist grammar (YAML: ``1`` is an integer, ``null`` is None,
``[8, 32]`` a list, ``{}`` an empty mapping); list items are addressed by index
(``workers.0.emulated_slowdown=2``). Merging is OmegaConf's: mappings merge key by key, any
other value replaces what was there. Every mistake becomes a ConfigError naming the override,
the key and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raytrain_hetero.config.problems import (
    ConfigProblem,
    file_problem,
    loc_path,
    raise_problems,
)

__all__ = ["dotted_to_nested", "merge_overrides", "parse_override", "parse_overrides"]

_EXAMPLE = "write KEY.PATH=VALUE, e.g. train.epochs=1"


def parse_override(text: str) -> dict[str, Any]:
    """Parse one ``KEY.PATH=VALUE`` override into a nested dict.

    ``train.epochs=1`` gives ``{"train": {"epochs": 1}}``, ``data.generate={}`` an empty
    mapping, ``ray.address=null`` ``None``, ``probe.batch_sizes=[8,32]`` a list and
    ``workers.0.emulated_slowdown=2`` ``{"workers": {"0": {"emulated_slowdown": 2}}}``.

    Raises:
        ConfigError: No ``=``, an empty key segment, or a value that is not valid YAML.
    """
    source = f"override {text!r}"
    key, sep, raw = text.partition("=")
    if not sep:
        file_problem(source, "has no '='", _EXAMPLE)
    if any(not part.strip() for part in key.split(".")):
        file_problem(source, f"has an empty key segment in {key!r}", _EXAMPLE)
    dotted = ".".join(part.strip() for part in key.split(".")) + "=" + raw
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([dotted]))
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as exc:
        lines = str(exc).strip().splitlines()
        first = getattr(exc, "problem", None) or (lines[0] if lines else type(exc).__name__)
        file_problem(
            source,
            f"value {raw!r} is not valid YAML: {first}",
            "quote the value, e.g. name='my run'",
        )
    assert isinstance(parsed, dict)  # a dotlist always gives a mapping
    return parsed


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse several ``KEY.PATH=VALUE`` overrides into one nested dict (later ones win)."""
    merged: dict[str, Any] = {}
    for item in items:
        merged = merge_overrides(merged, parse_override(item), source=f"override {item!r}")
    return merged


def merge_overrides(
    base: Mapping[str, Any], overrides: Mapping[str, Any], source: str = "<overrides>"
) -> dict[str, Any]:
    """Merge ``overrides`` over ``base`` with OmegaConf (neither is modified).

    Mappings merge key by key; any other override value replaces the base value. Where the
    base holds a list, the override's keys are item indices (``"0"``, ``"-1"``). Keys are
    taken literally (a tune search space's ``train.lr`` stays one key).

    Raises:
        ConfigError: An index into a list is not an integer or is out of range.
    """
    resolved = _list_items(base, overrides, (), source)
    out = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(dict(base)), resolved))
    assert isinstance(out, dict)
    return out


def _list_items(base: Any, over: Any, loc: tuple[str | int, ...], source: str) -> Any:
    """``over`` with every index mapping aimed at a list of ``base`` turned into that whole
    list, its addressed items merged (OmegaConf merges mappings but replaces lists)."""
    if not isinstance(over, Mapping):
        return over
    if not isinstance(base, list):
        below = base if isinstance(base, Mapping) else {}
        return {k: _list_items(below.get(k), v, (*loc, k), source) for k, v in over.items()}
    items = list(base)
    for key, value in over.items():
        index = _index(key, len(items), loc, source)
        new = _list_items(items[index], value, (*loc, index), source)
        if isinstance(items[index], Mapping) and isinstance(new, Mapping):
            new = OmegaConf.to_container(OmegaConf.merge(items[index], new))
        items[index] = new
    return items


def _index(key: Any, length: int, loc: tuple[str | int, ...], source: str) -> int:
    where = loc_path(loc)
    try:
        index = int(key)
    except (TypeError, ValueError):
        raise_problems(
            [
                ConfigProblem(
                    source,
                    where,
                    f"is a list, so {key!r} must be an item index",
                    f"address items by index, e.g. {where}.0.<key>=...",
                )
            ]
        )
    if not -length <= index < length:
        raise_problems(
            [
                ConfigProblem(
                    source,
                    where,
                    f"has {length} item(s), so index {index} is out of range",
                    f"use an index from 0 to {length - 1}",
                )
            ]
        )
    return index % length


def dotted_to_nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"train.lr": 0.1}`` -> ``{"train": {"lr": 0.1}}`` (for :func:`merge_overrides`)."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested
