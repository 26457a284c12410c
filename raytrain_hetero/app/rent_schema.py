"""The YAML file of ``raytrain-hetero rent``: :class:`RentFile`, and :func:`load_rent_file`.

``rent:`` is the library's :class:`~raytrain_hetero.config.rent.RentConfig` (region, zones,
the planner's knobs, the node labels); the other sections say what the planner prices:

.. code-block:: yaml

    rent: {region: us-east-1, planner: {max_nodes: {p4d.24xlarge: 1}}}
    deadline_h: 10               # or budget: 200 (dollars)
    job: {samples_per_epoch: 1281167, epochs: 90, global_batch: 4096}
    catalog: my_vms.csv          # SkyPilot vms.csv (v8); omitted: the built-in snapshot
    catalog_rows: []             # rows (the same columns) added over the catalog
    exchange: {across_nodes_s: 0.08, within_node_s: 0.04}
    cost_models:                 # per instance type, per worker: measured or an estimate
      - {instance_type: g5.xlarge, alpha: 0.012, beta: 0.0016}
      - {instance_type: p4d.24xlarge, published: lambda-resnet50-amp/A100-40GB}
    remembered: {storage: /runs, match: {p3.2xlarge: V100}}  # remembered cost models
    spot_loss: {rates: {g5.xlarge: 0.4}, traces: {p3.2xlarge: {path: us-east-1c_v100_1.json}}}
    worker_shapes: {g5.xlarge: {resources: {CPU: 3, GPU: 1}}}  # a worker slot per type
    train_job: job.yaml          # --apply: the job to train on the rented mix
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from raytrain_hetero.app.loading import _StrictLoader
from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import (
    Float,
    NonNegFloat,
    PositiveFloat,
    PositiveInt,
    absolute,
    invalid,
)
from raytrain_hetero.config.problems import file_problem, raise_validation_error, show
from raytrain_hetero.config.rent import RentConfig

__all__ = [
    "CostModelEntry",
    "RememberedCosts",
    "RentExchangeSection",
    "RentFile",
    "RentWork",
    "SpotLossSection",
    "TraceRef",
    "WorkerShape",
    "load_rent_file",
]


class RentWork(HeteroModel):
    """The job's work: ``samples_per_epoch x epochs`` samples at ``global_batch`` per step.

    Attributes:
        samples_per_epoch: Training samples per epoch.
        epochs: Epochs to train.
        global_batch: Samples per optimizer step; None: the ``train:`` job's
            ``train.global_batch_size``.
    """

    samples_per_epoch: PositiveInt
    epochs: PositiveFloat
    global_batch: PositiveInt | None = None


class RentExchangeSection(HeteroModel):
    """One full gradient exchange per step, in seconds, by where the group runs
    (:class:`~raytrain_hetero.core.rent_model.RentExchange`)."""

    across_nodes_s: NonNegFloat = 0.0
    within_node_s: NonNegFloat | None = None
    per_type_s: dict[str, NonNegFloat] = Field(default_factory=dict)


class CostModelEntry(HeteroModel):
    """The job's step on one instance type, per worker: ``t(b) = alpha + beta * b``.

    Give exactly one of: ``alpha`` and ``beta`` (measured, e.g. ``raytrain-hetero probe`` on
    one node of the type), ``published`` (a figure of
    :data:`~raytrain_hetero.workloads.rent_data.PUBLISHED_FIGURES`), or ``samples_per_s``
    with its ``source`` (a figure you name). A published figure is an estimate: every table
    marks it. With ``relative_to`` (a measured type of this file) and
    ``reference_samples_per_s`` / ``reference_published`` (that type's figure in the same
    table), the measured model is scaled by the figures' ratio instead.
    """

    instance_type: str
    alpha: NonNegFloat | None = None
    beta: PositiveFloat | None = None
    published: str | None = None
    samples_per_s: PositiveFloat | None = None
    source: str | None = None
    relative_to: str | None = None
    reference_published: str | None = None
    reference_samples_per_s: PositiveFloat | None = None
    workers_per_node: PositiveInt | None = None
    startup_s: NonNegFloat | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> CostModelEntry:
        kinds = [
            self.beta is not None or self.alpha is not None,
            self.published is not None,
            self.samples_per_s is not None,
        ]
        if sum(kinds) != 1:
            raise invalid(
                f"cost model of {self.instance_type!r} gives {sum(kinds)} kinds of figure",
                "give exactly one of alpha+beta (measured), published (a named figure) or "
                "samples_per_s with source",
            )
        if kinds[0] and self.beta is None:
            raise invalid("alpha without beta", "give beta (seconds per sample) too", ("beta",))
        if self.samples_per_s is not None and not self.source:
            raise invalid(
                "a figure without its source",
                "name where it is published in source:",
                ("source",),
            )
        if self.relative_to is not None and kinds[0]:
            raise invalid(
                "relative_to on a measured cost model",
                "remove relative_to (it scales a measured type for an estimated one)",
                ("relative_to",),
            )
        return self


class RememberedCosts(HeteroModel):
    """Cost models remembered by earlier runs (``probe.remember``), from their storage.

    Attributes:
        storage: The runs' storage (``ray.storage_path`` of the jobs that measured them).
        match: Per instance type, a text its remembered entry carries (its GPU's name, its
            CPU model, a worker label value); exactly one entry must match each.
    """

    storage: str
    match: dict[str, str]


class TraceRef(HeteroModel):
    """A spot trace file (SkyPilot's spot-traces format) and the nodes it followed."""

    path: Path
    nodes: PositiveInt = 1


class SpotLossSection(HeteroModel):
    """Spot losses per node-hour, per instance type: a rate, or a trace."""

    rates: dict[str, NonNegFloat] = Field(default_factory=dict)
    traces: dict[str, TraceRef] = Field(default_factory=dict)


class WorkerShape(HeteroModel):
    """One training worker on an instance type: what it takes of the node, its device.

    None resources: ``{CPU: 1, GPU: 1}`` on a type with accelerators, ``{CPU: vCPUs}``
    on one without."""

    resources: dict[str, NonNegFloat] | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    emulated_slowdown: Float = Field(1.0, ge=1.0, allow_inf_nan=False)


class RentFile(HeteroModel):
    """The rent file (see the module).

    Attributes:
        rent: Region, zones, planner knobs, node labels.
        deadline_h: End within this many hours, as cheaply as possible (or ``budget``).
        budget: Spend at most this many dollars, ending as soon as possible.
        job: The work.
        catalog: A SkyPilot ``vms.csv``; None: the built-in snapshot (not current prices).
        catalog_rows: Rows added over the catalog (same columns, as mappings).
        exchange: The exchange cost per group.
        cost_models: Per instance type the step cost (measured or estimated).
        remembered: Remembered cost models to read from a runs' storage.
        spot_loss: Spot loss rates or traces.
        worker_shapes: Per instance type one worker slot's resources (``--apply``).
        train_job: The job YAML to train on the rented mix (``--apply``); its ``workers:``
            are replaced by the plan's slots.
    """

    rent: RentConfig = Field(default_factory=RentConfig)
    deadline_h: Float | None = None
    budget: Float | None = None
    job: RentWork
    catalog: Path | None = None
    catalog_rows: list[dict[str, Any]] = Field(default_factory=list)
    exchange: RentExchangeSection = Field(default_factory=RentExchangeSection)
    cost_models: list[CostModelEntry] = Field(default_factory=list)
    remembered: RememberedCosts | None = None
    spot_loss: SpotLossSection = Field(default_factory=SpotLossSection)
    worker_shapes: dict[str, WorkerShape] = Field(default_factory=dict)
    train_job: Path | None = None


def load_rent_file(path: str | os.PathLike[str]) -> RentFile:
    """Read and validate a rent file; relative paths in it are taken from its directory.

    Raises:
        ConfigError: The file is missing or not YAML, or a value is invalid (each problem
            named with its fix).
    """
    source, p = str(path), Path(path)
    if not p.is_file():
        file_problem(source, f"rent file not found (looked at {absolute(p)})", "check the path")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        file_problem(source, f"cannot be read as YAML: {exc}", "correct the file")
    if not isinstance(data, Mapping):
        file_problem(
            source,
            f"the top level must be a mapping, got {show(data)}",
            "start with keys such as job:, deadline_h: and cost_models:",
        )
    base = p.resolve().parent
    data = dict(data)
    for key in ("catalog", "train_job"):
        if isinstance(data.get(key), str):
            data[key] = str(base / data[key])
    traces = (
        (data.get("spot_loss") or {}).get("traces")
        if isinstance(data.get("spot_loss"), dict)
        else None
    )
    if isinstance(traces, dict):
        for ref in traces.values():
            if isinstance(ref, dict) and isinstance(ref.get("path"), str):
                ref["path"] = str(base / ref["path"])
    remembered = data.get("remembered")
    if isinstance(remembered, dict) and isinstance(remembered.get("storage"), str):
        storage = remembered["storage"]
        if "://" not in storage:
            remembered["storage"] = str(base / storage)
    try:
        return RentFile.model_validate(data)
    except ValidationError as exc:
        raise_validation_error(exc, RentFile, source=source)
