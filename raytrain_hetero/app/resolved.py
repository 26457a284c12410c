"""The job resolved once: :func:`resolve_job` turns a :class:`~raytrain_hetero.app.config.JobConfig`
into a frozen :class:`ResolvedJob` that ``train``, ``probe``, ``tune`` and ``bench`` consume.

Every check that can run before a worker starts runs here, once, each in its own module and
in this order (the job object passes each module once; ``scripts/job_path.py`` measures it):

1. the job's own derived values (worker count, the library's
   :class:`~raytrain_hetero.config.BatchConfig`, retries) and, for a command that writes a
   run (``outputs=``), its output directory and run name, refused before any data is touched
   (:mod:`~raytrain_hetero.app.schema`, :mod:`~raytrain_hetero.app.runs`);
2. the data root (:mod:`~raytrain_hetero.app.fs_checks`), then the library's
   :class:`~raytrain_hetero.workloads.registry.DataSource` and its adapter, looked up once and
   handed to generation, the bad-file check and the opening of ``train`` and ``val``
   (:mod:`~raytrain_hetero.workloads.data`); the band count against what the source asks for;
3. the model, built once and checked against the data
   (:func:`~raytrain_hetero.app.datasets.check_model_fits_data`), or a ``model.task`` job's
   datamodule and task (:func:`~raytrain_hetero.app.lightning_job.check_task_job`);
4. the parallel layout against the built model
   (:func:`~raytrain_hetero.app.parallel_checks.check_parallel_fits_model`);
5. the training split against the workers' minimum slices, and the steps per epoch.

The workers' roles (``probe.roles: auto`` with a Ray Data source) are measured by a probe
after resolution, where the CLI decides them, and enter as one field
(:meth:`ResolvedJob.with_roles`). ``predict`` reads another split: it shares step 2 through
:func:`resolve_data`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_hetero.app.config import JobConfig, check_data_root
from raytrain_hetero.app.datasets import DataSizes, check_model_fits_data, data_source
from raytrain_hetero.app.parallel_checks import check_parallel_fits_model
from raytrain_hetero.app.runs import RunIdentity, check_output_dir, resolve_run
from raytrain_hetero.config.problems import construct
from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.data import generate_dataset, open_datasets
from raytrain_hetero.workloads.registry import (
    DatasetAdapter,
    DataSource,
    WorkloadData,
    dataset_adapter,
)

if TYPE_CHECKING:
    from torch import nn

    from raytrain_hetero.app.lightning_job import CheckedTask
    from raytrain_hetero.config import BatchConfig
    from raytrain_hetero.core.group_decision import GroupDecision
    from raytrain_hetero.storage import StorageLocation

__all__ = [
    "ResolvedData",
    "ResolvedJob",
    "ResolvedRun",
    "RunRequest",
    "resolve_data",
    "resolve_job",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRequest:
    """What a command that writes a run asks of its outputs (``raytrain-hetero train``).

    Attributes:
        output_dir: Where the outputs go (``None``: the job's ``output_dir``); a local
            directory or a URI.
        run_name: Ray Train run name (``None``: unique, ``<job name>-<time>-<random>``).
        resume: Continue the run ``run_name`` from its last checkpoint.
        overwrite: Write into a non-empty output directory (replacing the job's files).
    """

    output_dir: Path | str | None = None
    run_name: str | None = None
    resume: bool = False
    overwrite: bool = False


@dataclass(frozen=True, eq=False)
class ResolvedRun:
    """Where a resolved run writes, checked before any data was touched.

    Attributes:
        outputs: The output directory (local or remote), empty or allowed to be replaced.
        identity: The Ray Train run: its name, storage and whether it resumes.
    """

    outputs: StorageLocation
    identity: RunIdentity


@dataclass(frozen=True)
class ResolvedData:
    """A job's data as the library reads it: the source and its adapter, looked up once.

    Attributes:
        source: What ``data:`` asks to read.
        adapter: The registered dataset's adapter (generation, bad files, opening).
    """

    source: DataSource
    adapter: DatasetAdapter


@dataclass(frozen=True, eq=False)
class ResolvedJob:
    """A job with everything checkable checked, and what the checks built (see the module).

    Consumers read its fields; none of them re-runs a check or looks an adapter up again.

    Attributes:
        job: The job config (with ``roles``: its training workers only).
        data: The data source and its adapter.
        sizes: Training and validation samples, and bands per sample.
        world_size: Training workers (the sum of the groups' ``count``).
        batch: The library's batch settings (``train:`` without the optimiser).
        steps_per_epoch: Carved steps per epoch of the training split.
        max_failures: Ray Train restarts of a run (``train.max_failures`` or its default).
        model: The model of a ``model.name`` job, built once on the driver's CPU and checked
            against the data and the parallel layout (``None`` for a ``model.task`` job).
        lightning: A ``model.task`` job's datamodule and task, built and checked once.
        run: Where the run writes, for a command that writes one (``None`` otherwise).
        roles: The workers' roles decided before the run (``probe.roles: auto``), if any.
    """

    job: JobConfig
    data: ResolvedData
    sizes: DataSizes
    world_size: int
    batch: BatchConfig
    steps_per_epoch: int
    max_failures: int
    model: nn.Module | None = None
    lightning: CheckedTask | None = None
    run: ResolvedRun | None = None
    roles: GroupDecision | None = None

    def with_roles(self, roles: GroupDecision | None) -> ResolvedJob:
        """This job with the roles decided: its workers are the decision's trainers (the
        feeders' CPUs run the Ray Data pipeline), and what depends on the worker count
        follows; the data, model and layout checks stand (fewer workers need no more data).
        """
        if roles is None:
            return self
        from raytrain_hetero.app.ray_data_source import without_feeders

        job = without_feeders(self.job, roles)
        world = job.total_workers
        return dataclasses.replace(
            self,
            job=job,
            world_size=world,
            steps_per_epoch=_steps_per_epoch(self.sizes.train, self.batch, world),
            roles=roles,
        )


def resolve_data(job: JobConfig, *, check_root: bool = True) -> ResolvedData:
    """The job's data source and its adapter (looked up once), with the root checked first
    (``check_root``) so a missing or misplaced root stops the job before anything reads it
    (step 2 of the module, for a command that reads other splits than ``train`` and ``val``).

    Raises:
        DataError: The root is not a directory, or missing without ``data.generate``.
    """
    adapter = dataset_adapter(job.data.dataset)
    if check_root:
        check_data_root(job.data, adapter=adapter)
    return ResolvedData(source=data_source(job.data), adapter=adapter)


def resolve_job(job: JobConfig, *, outputs: RunRequest | None = None) -> ResolvedJob:
    """Check the job once, in the module's order, and return it resolved.

    The job object goes to each checking module once, in the order of the module's steps:
    this function hands it on itself (its helpers take the library's records), so the path
    never comes back to a module it left.

    Args:
        job: The job.
        outputs: For a command that writes a run: its output options, checked first.

    Raises:
        ConfigError: A non-empty output directory or a run name clash (with ``outputs``);
            a model that cannot be built or does not fit the parallel layout; too few
            training samples for the workers.
        DataError: A missing root, unreadable files, a band-count mismatch, or a task that
            cannot take the datamodule's batches.
    """
    # 1. The job's own derived values, read once; a run's outputs before any data.
    world = job.total_workers
    batch = job.train.batch()
    max_failures = job.resolved_max_failures()
    run = None
    if outputs is not None:
        target = job.ray.location(outputs.output_dir or job.output_dir)
        run = _resolve_run(job.name, target, job.ray.storage(target), outputs)
    # 2. The data (as resolve_data; a task job's datamodule checks its own root).
    task = job.model.task is not None
    adapter = dataset_adapter(job.data.dataset)
    if not task:
        check_data_root(job.data, adapter=adapter)
    data = ResolvedData(source=data_source(job.data), adapter=adapter)
    model = lightning = None
    if task:
        # 3. A task job: its datamodule and task, built and checked against each other.
        from raytrain_hetero.app.lightning_job import check_task_job

        lightning = check_task_job(job, data.source)
        sizes = lightning.sizes
    else:
        workload = _open_checked(data, job.data.bands)
        # 3. The model, built once and checked against the data; 4. the parallel layout.
        model = check_model_fits_data(job.model, workload, source=data.source.root)
        check_parallel_fits_model(job.parallel, model, world)
        sizes = DataSizes(
            len(workload.datasets["train"]), len(workload.datasets["val"]), workload.in_channels
        )
        # 5. Enough training samples for every worker's smallest slice.
        need = world * batch.min_slice_samples
        if sizes.train < need:
            raise ConfigError(
                f"data.root: the train split has {sizes.train} samples but {world} "
                f"workers need at least {need}; generate more (data.generate.samples_per_class) "
                "or use fewer workers."
            )
    return ResolvedJob(
        job=job,
        data=data,
        sizes=sizes,
        world_size=world,
        batch=batch,
        steps_per_epoch=_steps_per_epoch(sizes.train, batch, world),
        max_failures=max_failures,
        model=model,
        lightning=lightning,
        run=run,
    )


def _resolve_run(
    name: str, target: StorageLocation, storage: StorageLocation, outputs: RunRequest
) -> ResolvedRun:
    """The run's identity and its output directory, refused when they clash (the run name
    first: its message, add --resume, is the more specific one)."""
    identity = resolve_run(name, storage, outputs.run_name, outputs.resume)
    check_output_dir(target, overwrite=outputs.overwrite, resume=outputs.resume)
    return ResolvedRun(outputs=target, identity=identity)


def _open_checked(data: ResolvedData, bands_setting: Any) -> WorkloadData:
    """Generate (cached), check and open ``train`` and ``val`` through the adapter; their
    band count against what the source asks for (``bands_setting``: ``data.bands``, for the
    message)."""
    source, adapter = data.source, data.adapter
    root = Path(source.root)
    generate_dataset(source, adapter=adapter)
    workload = construct(
        f"opening data.dataset {source.dataset} at {root}",
        lambda: open_datasets(source, ("train", "val"), adapter=adapter),
        "correct data.root and the data.* settings (or the dataset's registered adapter).",
    )
    expected = adapter.expected_bands(source)
    if expected is not None and workload.in_channels != expected:
        raise DataError(
            f"{root}: images have {workload.in_channels} bands but data.bands="
            f"{bands_setting!r} asks for {expected}; fix data.bands or the dataset."
        )
    return workload


def _steps_per_epoch(train: int, batch: BatchConfig, world: int) -> int:
    """Carved steps per epoch of ``train`` samples (the carver's own count)."""
    return EpochCarver(
        train,
        batch.global_batch_size,
        seed=batch.seed,
        min_step_size=max(world, batch.step_workers or 0) * batch.min_slice_samples,
    ).steps_per_epoch
