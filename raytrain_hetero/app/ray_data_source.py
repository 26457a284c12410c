"""``data.source: ray_data``: a job's train split fed through a Ray Data pipeline.

The registered dataset's own reader (file lists, decoding, normalisation) runs inside Ray Data
``map_batches`` tasks, scheduled wherever Ray Data finds room, training nodes or not, instead
of in every training worker; the trainer carves the stream by the plan
(:class:`~raytrain_hetero.driver.data_config.HeteroDataConfig`). The pipeline is
``range(len(train split)) -> random_shuffle -> map_batches(decode)``: one shuffle of the row
ids per epoch, then decoding in batches. Validation stays on rank 0 as in the file source.

With ``probe.group: auto`` (:func:`job_roles`), a CPU worker that adds more samples/s decoding
for loader-bound trainers than training is left out of the training group
(:func:`without_feeders`): its CPUs then run the pipeline's decode tasks.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:
    import ray.data

    from raytrain_hetero.app.config import JobConfig
    from raytrain_hetero.core.group_decision import GroupDecision
    from raytrain_hetero.core.plan import Plan

__all__ = [
    "check_ray_data_job",
    "decode_rows",
    "format_roles_table",
    "job_roles",
    "train_pipeline",
    "without_feeders",
]

#: Rows per decode task call.
_DECODE_BATCH = 64


@functools.lru_cache(maxsize=4)
def _split(data_json: str, split: str = "train") -> Any:
    """A split of the job's dataset, opened once per Ray Data worker process."""
    from raytrain_hetero.app.datasets import open_configured_datasets
    from raytrain_hetero.app.sections import DataConfig

    data = DataConfig.model_validate(json.loads(data_json))
    return open_configured_datasets(data, (split,)).datasets[split]


def decode_rows(
    batch: dict[str, np.ndarray], data_json: str, split: str = "train"
) -> dict[str, np.ndarray]:
    """``map_batches`` UDF: the ``split``'s samples for the row ids in ``batch["id"]`` (the train
    stream), or in ``batch["index"]`` with their ``index`` and ``sample_id`` (prediction)."""
    from raytrain_hetero.inference.predict import decode_samples

    dataset = _split(data_json, split)
    if "index" in batch:
        return decode_samples(dataset, batch["index"], ids=True)
    return decode_samples(dataset, batch["id"])


def check_ray_data_job(job: JobConfig) -> None:
    """Refuse what the Ray Data source cannot do, in one line naming the fix."""
    if job.model.task is not None:
        raise ConfigError(
            "data.source: ray_data does not feed a Lightning task (model.task); use "
            "data.source: files, or drop model.task"
        )
    if job.parallel.model_parallel:
        raise ConfigError(
            f"data.source: ray_data does not feed parallel.mode={job.parallel.mode!r} yet; "
            "use data.source: files, or parallel.mode: data"
        )
    if job.data.cache or job.data.num_workers:
        raise ConfigError(
            "data.cache and data.num_workers apply to data.source: files; with ray_data the "
            "decoding runs in Ray Data tasks: remove them"
        )


def train_pipeline(job: JobConfig, rows: int | None = None) -> ray.data.Dataset:
    """The job's train split as a Ray Data pipeline (see the module); ``rows``: the split's
    size if the caller knows it (the resolved job's), else the split is opened to count it."""
    import ray.data

    check_ray_data_job(job)
    if rows is None:
        rows = len(_split(job.data.model_dump_json()))
    return (
        ray.data.range(rows)
        .random_shuffle()
        .map_batches(
            decode_rows,
            batch_size=_DECODE_BATCH,
            fn_kwargs={"data_json": job.data.model_dump_json()},
        )
    )


def job_roles(
    job: JobConfig, plan: Plan, names: list[str], rows: int | None = None
) -> GroupDecision:
    """Measure and decide the workers' roles from the probe's plan (its cost models): the
    group decision in mode ``auto`` (:func:`~raytrain_hetero.driver.roles.node_roles`).

    Args:
        job: The job (a ``ray_data`` source).
        plan: The probe's plan (one cost model per rank).
        names: Worker name of every rank.
        rows: The train split's size if known (the resolved job's); counted otherwise.
    """
    from raytrain_hetero.config import expand_worker_specs
    from raytrain_hetero.driver.roles import node_roles

    if rows is None:
        rows = len(_split(job.data.model_dump_json()))
    by_name = {s.name: s for s in expand_worker_specs(job.workers)}
    return node_roles(
        [by_name[n] for n in names],
        list(plan.costs or ()),
        plan.global_batch_size,
        dataset=train_pipeline(job, rows),
        delivery_rows=min(rows, 4 * plan.global_batch_size),
        min_slice=plan.min_slice,
        quantum=plan.quantum,
    )


def without_feeders(job: JobConfig, roles: GroupDecision) -> JobConfig:
    """The job whose workers are the decision's trainers (counts expanded): feeders and
    workers standing by leave the group."""
    from raytrain_hetero.config import expand_worker_specs

    out = {w.worker for w in roles.workers if w.verdict != "train"}
    kept = [s for s in expand_worker_specs(job.workers) if s.name not in out]
    return job.model_copy(update={"workers": kept})


def format_roles_table(roles: GroupDecision) -> str:
    """One line per worker (what it does, its samples/s training alone and feeding), the
    input pipeline's measured delivery, then the decision's summary."""
    pipeline = roles.everyone.bound == "pipeline" or roles.chosen.bound == "pipeline"
    lines = [f"{'rank':>4}  {'worker':<16} {'trains/s':>9} {'feeds/s':>9}  role"]
    for w in roles.workers:
        feeds = f"{w.feed_samples_per_s:>9.1f}" if w.feed_samples_per_s > 0 else f"{'-':>9}"
        role = w.verdict.replace("_", " ").upper()
        lines.append(f"{w.index:>4}  {w.worker:<16} {w.alone_samples_per_s:>9.1f} {feeds}  {role}")
    lines.append(
        "input pipeline: "
        + ("loader-bound with every worker training" if pipeline else "not the limit")
    )
    lines.append(roles.summary())
    return "\n".join(lines)
