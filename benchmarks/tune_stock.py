"""``stock`` of ``benchmarks.tune_asha``: plain Ray Tune over ``ray.train.torch.TorchTrainer``.

A function trainable (:func:`stock_trial`) runs the loop as Ray's docs write it
(:func:`stock_tune_loop`: ``prepare_model``, DDP averaging, a ``DistributedSampler``'s equal
``B / N`` slices) at fixed resources, with the same model, data, SGD and EMULATED node speeds
as the library's contenders; its trials stop through the same clean abort
(:func:`raytrain_hetero.tune.trial.abort_train_on_stop`). :func:`run_stock` runs the search.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from raytrain_hetero.tune.trial import EndTrainRunOnStop, abort_train_on_stop

__all__ = ["SPEED_LABEL", "WORKER_RESOURCE", "run_stock", "stock_trial", "stock_tune_loop"]

#: The node label whose value decides a worker's emulated factor.
SPEED_LABEL = "speed"
#: The custom resource only worker nodes have (keeps workers off the head).
WORKER_RESOURCE = "worker_node"


def stock_tune_loop(config: dict[str, Any]) -> None:
    """Per-worker loop of ``stock``: Ray's docs' loop (``prepare_model``, a ``DataLoader`` of
    ``B / N`` through ``prepare_data_loader``, ``set_epoch``), one report per epoch with rank
    0's validation accuracy and a small checkpoint; EMULATED node speed through the one
    emulator (:class:`raytrain_hetero.app.bench_stock.StockEmulation`, the factor from this
    node's label). Every rank appends its steps to ``<out>/rank<r>_<pid>.jsonl``.
    """
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from raytrain_hetero.app.bench_stock import StockEmulation
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.datasets import open_worker_data
    from raytrain_hetero.worker.measure.emulation import (
        SlowdownSchedule,
        current_node_labels,
        node_slowdown,
    )
    from raytrain_hetero.workloads.evaluation import dataset_accuracy

    job = validate_config(config["job"], source="stock job on a worker")
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    labels = current_node_labels()
    factor = node_slowdown(job.emulation.node_slowdowns, labels)
    speed = labels.get(SPEED_LABEL, "?")
    device = torch.device("cpu")
    torch.set_num_threads(1)
    torch.manual_seed(job.train.seed)
    _, datasets, model = open_worker_data(job, ("train", "val"))
    model = ray.train.torch.prepare_model(model, move_to_device=device)
    emulation = StockEmulation(SlowdownSchedule(factor, worker=speed, rank=rank), device)
    emulation.install(model)
    loader = DataLoader(
        datasets["train"], batch_size=max(1, job.train.global_batch_size // world), shuffle=True
    )
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=job.train.lr,
        momentum=job.train.momentum,
        weight_decay=job.train.weight_decay,
    )
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"rank{rank}_{os.getpid()}.jsonl").open("a", buffering=1) as log:
        for epoch in range(job.train.epochs):
            model.train()
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            for batch in loader:
                x, y = batch["image"].to(device), batch["label"].to(device)
                started = time.time()
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # the comm hook stretches before each all-reduce
                optimizer.step()
                emulation.step += 1
                log.write(
                    json.dumps(
                        {
                            "epoch": epoch,
                            "rank": rank,
                            "speed": speed,
                            "factor": factor,
                            "slice": int(y.shape[0]),
                            "start": started,
                            "end": time.time(),
                        }
                    )
                    + "\n"
                )
            metrics: dict[str, Any] = {"epoch": epoch}
            if rank != 0:
                ray.train.report(metrics)
                continue
            inner = getattr(model, "module", model)
            metrics["val_accuracy"] = dataset_accuracy(inner, datasets["val"], device)
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "epoch").write_text(f"{epoch}\n")
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


@abort_train_on_stop
def stock_trial(
    params: dict[str, Any],
    *,
    base_job: dict[str, Any],
    workers: int,
    storage_path: str,
    steps_dir: str,
) -> None:
    """Tune function trainable of ``stock``: a ``TorchTrainer`` at fixed resources."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_hetero.app.config import JobConfig
    from raytrain_hetero.app.tune_job import trial_job
    from raytrain_hetero.tune.trial import trial_report_callback

    job = trial_job(JobConfig.model_validate(base_job), params)
    context = tune.get_context()
    trial_id = context.get_trial_id()
    trainer = TorchTrainer(
        stock_tune_loop,
        train_loop_config={
            "job": job.model_dump(mode="json"),
            "out": str(Path(steps_dir) / trial_id),
        },
        scaling_config=ScalingConfig(
            num_workers=workers, resources_per_worker={"CPU": 1, WORKER_RESOURCE: 1}
        ),
        run_config=RunConfig(
            name=f"{context.get_experiment_name()}-{trial_id}",
            storage_path=storage_path,
            # The same report path and clean stop as ours: ASHA's stops free the workers.
            callbacks=[trial_report_callback()],
        ),
    )
    trainer.fit()


def run_stock(
    setup: Any, base: dict[str, Any], out: Path, verbose: int = 0, scheduler: Any = None
) -> dict[str, Any]:
    """The ``stock`` search (``scheduler``: a trial scheduler instead of ASHA, e.g. a replay);
    returns ``{"wall_time_s", "storage", "started"}``."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # By reference from its module (not __main__), so Tune's workers can import it.
    from benchmarks.tune_stock import stock_trial as trainable
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.job import prepare_dataset
    from raytrain_hetero.tune.search import param_space, trial_scheduler

    job = validate_config(base, source="stock job")
    cfg = job.tune
    assert cfg is not None
    prepare_dataset(job)  # generated once (cached) for all three
    out.mkdir(parents=True, exist_ok=True)
    storage = out / "ray_results"
    name = f"tune-asha-stock-{time.strftime('%Y%m%d-%H%M%S')}"
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(
                trainable,
                base_job=job.model_dump(mode="json"),
                workers=setup.stock_workers,
                storage_path=str(storage),
                steps_dir=str(out / "steps"),
            ),
            {"cpu": cfg.trial_cpus},
        ),
        param_space=param_space(cfg.search_space),
        tune_config=tune.TuneConfig(
            metric=cfg.metric,
            mode=cfg.mode,
            scheduler=scheduler
            or trial_scheduler(
                "asha",
                max_epochs=job.train.epochs,
                grace_period=cfg.grace_period,
                reduction_factor=cfg.reduction_factor,
            ),
            search_alg=BasicVariantGenerator(random_state=cfg.seed),
            num_samples=cfg.num_samples,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            verbose=verbose,
            callbacks=[EndTrainRunOnStop()],  # a stopped trial frees its workers first
        ),
    )
    started = time.time()
    t0 = time.perf_counter()
    tuner.fit()
    return {
        "wall_time_s": time.perf_counter() - t0,
        "storage": str(storage / name),
        "started": started,
    }
