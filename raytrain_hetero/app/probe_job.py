"""``raytrain-hetero probe``: measure the workers a job would start and print their speeds and
the plan they would get, without training (:func:`run_probe`; :func:`probe_loop` runs on
every worker)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import JobConfig, validate_config
from raytrain_hetero.app.job import build_trainer, init_ray
from raytrain_hetero.app.resolved import ResolvedJob, resolve_job
from raytrain_hetero.core.group_decision import GroupDecision
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError


def probe_loop(config: dict[str, Any]) -> None:
    """Per-worker loop of ``raytrain-hetero probe``: probe, calibrate, agree a plan, report it."""
    import raytrain_hetero as rh
    from raytrain_hetero.app.datasets import open_worker_data

    job = validate_config(config["job"], source="job config on a worker")
    _, datasets, model = open_worker_data(job, ("train",))
    rh.prepare_model(model)  # for its side effect: the probe times this model on each worker
    loader = rh.prepare_data_loader(datasets["train"], num_workers=job.data.num_workers)
    loader.ensure_plan()
    import ray.train
    import torch.distributed as dist

    info = rh.get_rank_info()
    workers: list[Any] = [None] * info["world_size"]
    dist.all_gather_object(workers, {k: info[k] for k in ("rank", "worker", "device")})
    metrics = {"plan": rh.current_plan().to_dict(), "workers": workers}
    if rh.current_plan().costs is not None:
        from raytrain_hetero.worker.api import admission_report

        metrics["admission"] = admission_report()
    if info["rank"] == 0:
        # Ray Train V2 keeps metrics of reports that carry a checkpoint.
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "probe.json").write_text(json.dumps(metrics))
            rh.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
    else:
        rh.report(metrics)


def run_probe(job: JobConfig | ResolvedJob) -> Plan:
    """Measure the workers a job would start and print their speeds and the plan (no training)."""
    return probe_with_roles(job)[0]


def probe_with_roles(job: JobConfig | ResolvedJob) -> tuple[Plan, GroupDecision | None]:
    """:func:`run_probe`, and with a Ray Data source the workers' roles (measured, printed).
    ``job``: a job (resolved here) or a resolved job (``raytrain-hetero train`` deciding
    roles before its run)."""
    from ray.train import RunConfig

    from raytrain_hetero.app.outputs import format_admission_table, format_worker_table
    from raytrain_hetero.app.runs import unique_run_name

    config = job.job if isinstance(job, ResolvedJob) else job
    if config.model.task is not None:
        raise ConfigError(
            "raytrain-hetero probe times model.name's network, not a model.task. Fix: run "
            "train without train.fixed_shares; its first plan comes from a probe of the task."
        )
    resolved = job if isinstance(job, ResolvedJob) else resolve_job(job)
    job = resolved.job
    init_ray(resolved)
    storage = job.ray.location(
        job.ray.storage_path or Path(tempfile.mkdtemp(prefix="raytrain-hetero-probe-"))
    )
    trainer = build_trainer(
        resolved,
        probe_loop,
        RunConfig(name=unique_run_name(f"{job.name}-probe"), **storage.run_config_storage()),
        probe_only=True,
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    metrics = result.metrics or {}
    plan = Plan.from_dict(metrics["plan"])  # JSON in rank 0's report
    workers = {w["rank"]: w for w in metrics["workers"]}
    rows = []
    for rank, slice_ in enumerate(plan.slices):
        beta = plan.costs[rank].beta if plan.costs else float("nan")
        rows.append(
            {
                "rank": rank,
                "worker": workers[rank]["worker"],
                "device": workers[rank]["device"],
                "samples_per_s": 1.0 / beta if beta and math.isfinite(beta) else float("nan"),
                "slice": slice_,
                "weight": slice_ / plan.global_batch_size,
            }
        )
    print(format_worker_table(rows))
    print(f"plan v{plan.version}: slices {list(plan.slices)} ({plan.reason})")
    admission = metrics.get("admission")
    if admission is not None:
        print(format_admission_table(admission))
    roles = None
    if job.data.source == "ray_data" and plan.costs is not None:
        from raytrain_hetero.app.ray_data_source import format_roles_table, job_roles

        names = [workers[r]["worker"] for r in range(len(plan.slices))]
        roles = job_roles(job, plan, names, rows=resolved.sizes.train)
        print(format_roles_table(roles))
    return plan, roles
