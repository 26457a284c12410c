"""Lightning tasks and datamodules by name, with their arguments checked before anything runs.

YAML names them (``model.task: torchgeo.SemanticSegmentationTask``,
``data.datamodule: torchgeo.EuroSATDataModule``); this module turns a name into the class
and checks argument names against the class's signature, so a misspelt argument fails when
the config is validated, naming the argument and the closest valid one.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from raytrain_hetero.config.problems import closest
from raytrain_hetero.errors import ConfigError

#: Task names of ``model.task`` and where each class lives.
TASKS: dict[str, str] = {
    "torchgeo.ClassificationTask": "torchgeo.trainers",
    "torchgeo.SemanticSegmentationTask": "torchgeo.trainers",
}

#: ``data.datamodule`` names: ``torchgeo.<Name>`` (any torchgeo datamodule) or ours.
DATAMODULE_PREFIXES: dict[str, str] = {
    "torchgeo.": "torchgeo.datamodules",
    "raytrain_hetero.": "raytrain_hetero.workloads.scene_segmentation",
}


def resolve_task(name: str) -> type:
    """The LightningModule class of a ``model.task`` name."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return getattr(importlib.import_module(TASKS[name]), name.split(".", 1)[1])  # type: ignore[no-any-return]


def resolve_datamodule(name: str) -> type:
    """The LightningDataModule class of a ``data.datamodule`` name."""
    for prefix, module_name in DATAMODULE_PREFIXES.items():
        if name.startswith(prefix):
            module = importlib.import_module(module_name)
            short = name[len(prefix) :]
            known = [n for n in getattr(module, "__all__", dir(module)) if n.endswith("DataModule")]
            if short in known:
                return getattr(module, short)  # type: ignore[no-any-return]
            hint = closest(short, known)
            raise ConfigError(
                f"unknown datamodule {name!r}"
                + (f"; did you mean {prefix}{hint}?" if hint else f"; {module_name} has none")
            )
    raise ConfigError(
        f"datamodule {name!r} must start with one of {', '.join(DATAMODULE_PREFIXES)} "
        "(e.g. torchgeo.EuroSATDataModule, raytrain_hetero.SceneSegmentationDataModule)"
    )


def _parameters(cls: type) -> tuple[set[str], bool]:
    """Named ``__init__`` parameters of ``cls`` and whether it takes ``**kwargs``."""
    signature = inspect.signature(cls.__init__)
    names = {p.name for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD}
    names.discard("self")
    var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return names, var_kw


def _accepted(cls: type) -> tuple[set[str], bool]:
    """Argument names ``cls`` takes, with those of the torchgeo dataset a torchgeo datamodule
    forwards ``**kwargs`` to (``EuroSATDataModule`` -> ``torchgeo.datasets.EuroSAT``), and
    whether it takes any name (``**kwargs`` that go nowhere we can check)."""
    names, var_kw = _parameters(cls)
    forwarded = None
    if var_kw and cls.__module__.startswith("torchgeo."):
        datasets = importlib.import_module("torchgeo.datasets")
        forwarded = getattr(datasets, cls.__name__.removesuffix("DataModule"), None)
    if forwarded is None:
        return names, var_kw
    extra, extra_kw = _parameters(forwarded)
    return names | extra, extra_kw


def location_argument(cls: type) -> str | None:
    """``"paths"`` or ``"root"``: where ``cls`` (or the torchgeo dataset it forwards
    ``**kwargs`` to) takes its data location (raster datasets take ``paths``); else None."""
    names, _ = _accepted(cls)
    return next((key for key in ("paths", "root") if key in names), None)


def check_arguments(cls: type, arguments: Mapping[str, Any], what: str) -> None:
    """Raise :class:`ConfigError` naming an argument that ``cls`` does not take.

    A torchgeo datamodule that forwards ``**kwargs`` to its dataset is checked against the
    union of both signatures; other ``**kwargs`` classes accept any name.
    """
    names, any_name = _accepted(cls)
    if any_name:
        return
    bad = [k for k in arguments if k not in names]
    if bad:
        hint = closest(bad[0], sorted(names))
        raise ConfigError(
            f"{what}: {cls.__name__} takes no argument {bad[0]!r}"
            + (f"; did you mean {hint!r}?" if hint else "")
            + f" (it takes {', '.join(sorted(names))})"
        )
