"""The YAML job schema: :class:`JobConfig`, composed of the library's config objects.

The run sections ARE the library's classes (``probe:``, ``workers:``, ``scheduler:``,
``elastic:``, ``emulation:``, ``backend:``, ``guard:``, ``parallel:``, ``tracking:``; ``train:``
extends :class:`~raytrain_hetero.config.BatchConfig` with the optimiser), so defaults and
checks are the library's, cross-section checks too
(:func:`~raytrain_hetero.config.run_setting_problems`). YAML-only: ``data``, ``model``
(:mod:`raytrain_hetero.app.sections`), ``ray``, ``tune``, ``output_dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from raytrain_hetero.app.overrides import dotted_to_nested, merge_overrides
from raytrain_hetero.app.parallel_checks import parallel_setting_problems
from raytrain_hetero.app.sections import DataConfig, ModelConfig
from raytrain_hetero.config import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    GuardConfig,
    HeteroModel,
    ParallelConfig,
    ProbeConfig,
    SchedulerConfig,
    SettingPaths,
    TrackingConfig,
    WorkerSpec,
    expand_worker_specs,
    run_setting_problems,
)
from raytrain_hetero.config.allocation import AllocationMode, TrialAllocatorConfig
from raytrain_hetero.config.fields import (
    Float,
    Int,
    NonNegFloat,
    PositiveFloat,
    PositiveInt,
    Problems,
    absolute,
    check_name,
    invalid,
    multiple,
)
from raytrain_hetero.config.problems import closest, describe, show
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.storage import (
    StorageFilesystem,
    StorageLocation,
    check_no_credentials,
    is_uri,
    storage_location,
)
from raytrain_hetero.tune.search import SearchDistribution

__all__ = [
    "TUNABLE_SECTIONS",
    "JobConfig",
    "RayConfig",
    "SearchDistribution",
    "TrainConfig",
    "TuneConfig",
]

#: Where the library's groups sit in a job file (for the cross-section checks' messages).
JOB_PATHS = SettingPaths(
    workers=("workers",),
    batch=("train",),
    elastic=("elastic",),
    slowdowns=("emulation", "slowdowns"),
)

# ------------------------------------------------------------------------------ training


class TrainConfig(BatchConfig):
    """The ``train:`` section: the library's :class:`~raytrain_hetero.config.BatchConfig`
    (global_batch_size, min_slice, weighting, fixed_shares, seed) plus the job's optimiser.

    Attributes:
        epochs: Passes over the training split.
        global_batch_size: As BatchConfig; a job defaults it to 192.
        lr: SGD learning rate. momentum: SGD momentum. weight_decay: L2 penalty.
        max_failures: Ray Train ``FailureConfig.max_failures`` of the run (and of each Tune
            trial); ``None``: 3 for elastic runs (losing a node is expected there), 1
            otherwise (one restart rides out a crashed worker; a deterministic error such as
            a corrupt file stops after two tries) (:meth:`JobConfig.resolved_max_failures`).
    """

    epochs: PositiveInt = 3
    # The only YAML default on top of the library: a job file may leave the batch size out.
    global_batch_size: PositiveInt = 192
    lr: PositiveFloat = 0.05
    momentum: Float = Field(0.9, ge=0, lt=1, allow_inf_nan=False)
    weight_decay: NonNegFloat = 5e-4
    # Ray's default (0) ends a run at the first worker death or lost node, elastic or not.
    max_failures: Int | None = Field(None, ge=0, le=1000)

    def batch(self) -> BatchConfig:
        """The library's BatchConfig of this section (the optimiser and retry keys left
        out)."""
        return BatchConfig(**{k: getattr(self, k) for k in BatchConfig.model_fields})


class RayConfig(HeteroModel):
    """How to reach Ray.

    Attributes:
        address: Address of an existing cluster (``"auto"``, ``"ray://host:10001"``, ...);
            ``None`` starts an embedded local Ray.
        num_cpus: CPUs of the embedded local Ray (``None``: all of this machine's).
        dashboard_host: Interface the dashboard binds to.
        storage_path: Ray Train storage (checkpoints): a local path (resolved absolute; on a
            multi-node cluster one every node mounts) or a URI (``s3://bucket/runs``,
            ``gs://...``, ``abfs://...``: anything ``pyarrow.fs.FileSystem.from_uri`` opens).
        storage_filesystem: Endpoint, region and scheme of ``s3://`` / ``gs://`` locations
            (:class:`~raytrain_hetero.storage.StorageFilesystem`); credentials come from the
            environment or the instance role, never from here.
    """

    address: str | None = None
    num_cpus: PositiveInt | None = None
    dashboard_host: str = "127.0.0.1"
    storage_path: Path | str | None = None
    storage_filesystem: StorageFilesystem | None = None

    @field_validator("address")
    @classmethod
    def _non_empty_address(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise invalid(
                "address is empty",
                "remove it (or set it to null) for a local Ray, or give e.g. 'auto'",
            )
        return value

    @field_validator("storage_path")
    @classmethod
    def _absolute_storage(cls, value: Path | str | None) -> Path | str | None:
        return None if value is None else local_or_uri(value, absolute_path=True)

    def storage(self, outputs: StorageLocation) -> StorageLocation:
        """Where Ray Train keeps the job's runs: ``storage_path``, else
        ``<outputs>/ray_results``."""
        if self.storage_path is None:
            return outputs.join("ray_results")
        return storage_location(self.storage_path, self.storage_filesystem)

    def location(self, place: Path | str) -> StorageLocation:
        """Any of the job's locations (outputs, a checkpoint), through the same filesystem."""
        return storage_location(place, self.storage_filesystem)


def local_or_uri(value: Path | str, *, absolute_path: bool = False) -> Path | str:
    """A location of a job file: a URI stays a string (checked for credentials), anything
    else is a local :class:`~pathlib.Path` (absolute if ``absolute_path``)."""
    if is_uri(value):
        try:
            check_no_credentials(str(value))
        except ConfigError as exc:
            raise invalid(
                str(exc).split(". Fix: ")[0],
                "give credentials through the environment or an instance role, never in the URI",
            ) from exc
        return str(value).rstrip("/")
    return absolute(Path(value)) if absolute_path else Path(value)


# ------------------------------------------------------------------------------ tune

#: Sections of a job whose keys a search space may vary (``workers``, ``data`` and ``ray``
#: decide placement and data layout, which every trial must share).
TUNABLE_SECTIONS: tuple[str, ...] = ("train", "model", "probe")


class TuneConfig(HeteroModel):
    """A hyperparameter search over the job (``raytrain-hetero tune``).

    Each trial trains the job with the search-space values merged over it. The trial's
    driver holds ``trial_cpus``; its worker group reserves the workers' resources through
    Ray Train's own placement group, atomically, so trials never hold half a worker group.

    Attributes:
        search_space: Dotted job keys (``train.lr``, ``model.width``, ...) and their
            distributions.
        num_samples: Trials to run (each grid point this many times).
        metric: Metric the search optimises. mode: ``"max"`` or ``"min"``.
        scheduler: ``"asha"`` stops weak trials early (per epoch); ``"fifo"`` runs all.
        grace_period: Epochs every trial gets before ASHA may stop it.
        reduction_factor: ASHA keeps the best 1/reduction_factor of trials per rung.
        max_concurrent_trials: Trials running at once; ``None``: as many as the cluster
            holds at once (their worker groups all placed).
        trial_cpus: CPUs each trial's driver process reserves (it only coordinates).
        seed: Seed of the search (which values are drawn).
        allocation: ``fixed``: every trial gets the whole ``workers:`` list (``count`` each);
            ``auto``: ``workers:`` lists worker *types* and the search's allocator decides
            which workers each trial holds, moving a trial at an epoch end when that
            changes (docs/design/tune-allocation.md).
        allocator: Settings of ``allocation: auto``.
    """

    search_space: dict[str, SearchDistribution] = Field(
        min_length=1, description="dotted job keys and distributions, e.g. train.lr"
    )
    num_samples: PositiveInt = 4
    metric: Literal["val_accuracy", "samples_per_s"] = "val_accuracy"
    mode: Literal["max", "min"] = "max"
    scheduler: Literal["asha", "fifo"] = "asha"
    grace_period: PositiveInt = 1
    reduction_factor: Float = Field(2.0, gt=1, allow_inf_nan=False)
    max_concurrent_trials: PositiveInt | None = None
    trial_cpus: NonNegFloat = 0.25
    seed: Int | None = Field(0, ge=0)
    allocation: AllocationMode = "fixed"
    allocator: TrialAllocatorConfig = Field(default_factory=TrialAllocatorConfig)


def _section_fields(section: str) -> list[str]:
    model = {"train": TrainConfig, "model": ModelConfig, "probe": ProbeConfig}[section]
    return list(model.model_fields)


# ------------------------------------------------------------------------------ job


class JobConfig(HeteroModel):
    """A complete training job; the root of the YAML file.

    Every section but ``data`` and ``workers`` may be left out (its class's defaults).

    Attributes:
        name: Job name (the prefix of Ray run names).
        output_dir: Where metrics and plots go: a local directory or a URI
            (``s3://bucket/out``).
        tune: The hyperparameter search of ``raytrain-hetero tune``.
    """

    name: str = "raytrain-hetero"
    data: DataConfig = Field(description="dataset settings (needs at least root)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    workers: list[WorkerSpec] = Field(
        min_length=1, description="worker groups, e.g. [{name: fast}, {name: slow}]"
    )
    ray: RayConfig = Field(default_factory=RayConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    elastic: ElasticConfig = Field(default_factory=ElasticConfig)
    emulation: EmulationConfig = Field(default_factory=EmulationConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    output_dir: Path | str = Path("outputs/run")
    tune: TuneConfig | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_name(value, "job name")

    @field_validator("output_dir")
    @classmethod
    def _output_location(cls, value: Path | str) -> Path | str:
        return local_or_uri(value)

    @property
    def total_workers(self) -> int:
        """Number of training workers (sum of the groups' ``count``)."""
        return sum(w.count for w in self.workers)

    def resolved_max_failures(self) -> int:
        """``train.max_failures``, or its default: 3 for elastic runs, 1 for fixed groups."""
        if self.train.max_failures is not None:
            return self.train.max_failures
        return 3 if self.elastic.min_workers is not None else 1

    def expanded_workers(self) -> list[WorkerSpec]:
        """One :class:`WorkerSpec` per worker (``count == 1``), in rank order
        (:func:`~raytrain_hetero.config.expand_worker_specs`)."""
        return expand_worker_specs(self.workers)

    @model_validator(mode="after")
    def _model_fits_dataset(self) -> JobConfig:
        kind, name = self.data.dataset, self.model.name
        if name == "fusion_cnn" and kind != "multimodal":
            raise invalid(
                f"fusion_cnn needs two modalities, but data.dataset is {kind!r}",
                "use data.dataset: multimodal, or another model.name",
                ("model", "name"),
            )
        if kind == "multimodal" and name != "fusion_cnn":
            raise invalid(
                f"dataset multimodal stacks SAR and multispectral bands; {name} would mix "
                "them in one branch",
                "use model.name: fusion_cnn (model.modalities: [s1] or [s2] for one branch)",
                ("model", "name"),
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        problems = run_setting_problems(
            self.workers, self.train, self.elastic, self.emulation, JOB_PATHS, self.parallel
        )
        problems += parallel_setting_problems(self.parallel, self.model)
        if problems:
            raise multiple(problems)
        return self

    @model_validator(mode="after")
    def _tune_space_fits(self) -> JobConfig:
        if self.tune is None:
            return self
        problems = Problems()
        tunable = [f"{s}.{f}" for s in TUNABLE_SECTIONS for f in _section_fields(s)]
        base = self.model_dump(mode="json", exclude={"tune"})
        for key, distribution in self.tune.search_space.items():
            at: tuple[str | int, ...] = ("tune", "search_space", key)
            section, _, rest = key.partition(".")
            if section not in TUNABLE_SECTIONS or rest not in _section_fields(section):
                close = closest(rest or key, [t.partition(".")[2] for t in tunable])
                guess = (
                    next((t for t in tunable if t.endswith("." + close)), None) if close else None
                )
                problems.add(
                    at,
                    f"{key!r} is not a tunable key; tunable keys are those of "
                    f"{', '.join(TUNABLE_SECTIONS)}, e.g. train.lr, model.width",
                    f"rename it to {guess!r}"
                    if guess
                    else "use a key such as train.lr, "
                    "train.weight_decay, train.global_batch_size or model.width",
                )
                continue
            if key == "train.epochs":
                problems.add(
                    at,
                    "train.epochs cannot be searched: it is every trial's budget (ASHA "
                    "decides how many epochs a weak trial gets)",
                    "set train.epochs in the job and remove it from tune.search_space",
                )
                continue
            for value in distribution.candidate_values():
                merged = merge_overrides(base, dotted_to_nested({key: value}))
                try:
                    JobConfig.model_validate(merged)
                except ValidationError as exc:
                    inner = [p for e in exc.errors() for p in describe(e, "", JobConfig)]
                    first = inner[0] if inner else None
                    why = f"{first.path}: {first.message}" if first else str(exc)
                    problems.add(
                        (*at, distribution.kind),
                        f"the value {show(value)} makes the job invalid ({why})",
                        "narrow the range or drop that value"
                        + (f"; or {first.fix}" if first else ""),
                    )
        if problems:
            raise multiple(problems)
        return self
