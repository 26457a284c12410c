"""The job's train loop, run by every Ray worker (:func:`classification_loop`).

One loop for the three ``parallel.mode`` values; what differs sits in a runner:
:class:`DataParallelRunner` (``data``) or :class:`ModelParallelRunner` (``conv_split``,
``branches``: a group reads its replica's slice; each epoch start may re-split). Checkpoints
hold the FULL (unsplit) model and optimizer state in one format (``model.pt``:
``{"model", "optimizer", "meta"}``), so any mode and world size resumes any checkpoint and
``raytrain-hetero predict`` loads it unchanged.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_hetero.app.config import JobConfig, validate_config
from raytrain_hetero.atomic import atomic_write_json
from raytrain_hetero.tune.allocator import epoch_end_moves

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "LAYOUT_FILE",
    "DataParallelRunner",
    "ModelParallelRunner",
    "classification_loop",
    "layout_metrics",
]

logger = logging.getLogger(__name__)

#: File in a model-parallel checkpoint holding the layout it was trained with (for the
#: driver's live progress view; the report metrics carry the same keys).
LAYOUT_FILE = "layout.json"

#: Samples in the example batch handed to ``prepare_model_parallel`` (its shapes matter only).
_EXAMPLE_SAMPLES = 2


def _optimizer(job: JobConfig, parameters: Any) -> torch.optim.Optimizer:
    import torch

    import raytrain_hetero as rh

    return rh.prepare_optimizer(
        torch.optim.SGD(
            parameters,
            lr=job.train.lr,
            momentum=job.train.momentum,
            weight_decay=job.train.weight_decay,
        )
    )


class DataParallelRunner:
    """``parallel.mode: data``: the whole model on every rank, count-weighted DDP sync."""

    mode = "data"

    def __init__(self, job: JobConfig, model: nn.Module) -> None:
        import raytrain_hetero as rh

        self.model = rh.prepare_model(model)
        self.optimizer = _optimizer(job, self.model.parameters())

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's full model and optimizer state."""
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def start_epoch(self) -> None:
        """Training mode for the epoch."""
        self.model.train()

    def step(self, batch: dict[str, Any]) -> float:
        """One carved step; returns the loss of this rank's slice."""
        import torch.nn.functional as F

        import raytrain_hetero as rh

        self.optimizer.zero_grad(set_to_none=True)
        slice_loss = 0.0
        # One part (the whole slice, weight 1) unless a memory cap splits it: count-weighted
        # micro-batches, gradients synchronised once after the last.
        for part in rh.micro_batches(batch):
            loss = F.cross_entropy(self.model(part.data["image"]), part.data["label"])
            if part.weight == 1.0:
                loss.backward()
            else:
                (loss * part.weight).backward()
            slice_loss += float(loss.item()) * part.weight
        self.optimizer.step()  # guarded: a non-finite step is skipped on every rank
        return slice_loss

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The single-device model and optimizer state (only rank 0 needs it here)."""
        return self.model.module.state_dict(), self.optimizer.state_dict()

    def evaluation_model(self) -> nn.Module:
        """The model to validate (the replica itself)."""
        return self.model.module

    def layout_metrics(self) -> dict[str, Any]:
        """Report keys of the layout; data mode: the (estimated) gradient traffic per step."""
        import raytrain_hetero as rh
        from raytrain_hetero.parallel.branches import data_parallel_bytes_per_step

        world = rh.get_rank_info()["world_size"]
        return {
            "hetero/parallel_mode": "data",
            "hetero/bytes_per_step": data_parallel_bytes_per_step(self.model.module, world),
        }


class ModelParallelRunner:
    """``parallel.mode: conv_split | branches`` through ``rh.prepare_model_parallel``."""

    def __init__(self, job: JobConfig, model: nn.Module, example: torch.Tensor) -> None:
        import raytrain_hetero as rh

        self.mode = job.parallel.mode
        self.pm = rh.prepare_model_parallel(model, example_input=example)
        self.optimizer = _optimizer(job, self.pm.parameters())
        self.resplits = 0
        self.bytes_sent = 0  # by this rank since the last report
        # The first epoch of a submission follows the probe of prepare_model_parallel.
        self.just_probed = True
        self.steps = 0

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's full (unsplit) model and optimizer state into this rank's share."""
        self.pm.restore(state["model"], self.optimizer, state["optimizer"])

    def start_epoch(self) -> None:
        """Re-probe and re-split if the split no longer fits the workers' speeds."""
        self.pm.train()
        if self.just_probed:
            self.just_probed = False
            return
        moved = self.pm.maybe_resplit(self.optimizer)
        if moved is not None:
            self.resplits += 1
            logger.info("re-split at epoch start: %s", moved)

    def step(self, batch: dict[str, Any]) -> float:
        """One split/pipelined step over this rank's replica slice."""
        import torch.nn.functional as F

        out = self.pm.train_step(batch["image"], batch["label"], F.cross_entropy, self.optimizer)
        self.bytes_sent += out.bytes_sent
        self.steps += 1
        return float(out.loss)

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Collective: the single-device model and optimizer state (every rank calls it)."""
        return self.pm.full_state_dict(), self.pm.full_optimizer_state_dict(self.optimizer)

    def evaluation_model(self) -> nn.Module:
        """Collective: a plain single-device copy of the model (every rank calls it)."""
        return self.pm.unsplit_model()

    def layout_metrics(self) -> dict[str, Any]:
        """Collective: report keys of the current layout and the traffic per step.

        ``hetero/bytes_per_step`` is what all ranks together sent per step since the last
        report (activations, their gradients and the cross-replica gradient all-reduce).
        """
        import torch
        import torch.distributed as dist

        moved = torch.tensor([float(self.bytes_sent), float(self.steps)], dtype=torch.float64)
        dist.all_reduce(moved)
        steps_per_rank = moved[1].item() / dist.get_world_size()
        self.bytes_sent, self.steps = 0, 0
        return {
            "hetero/parallel_mode": self.mode,
            "hetero/bytes_per_step": (
                round(moved[0].item() / steps_per_rank) if steps_per_rank else 0
            ),
            "hetero/resplits": self.resplits,
            **layout_metrics(self.pm.layout()),
        }


def layout_metrics(layout: Any) -> dict[str, Any]:
    """Report keys of a ``ParallelLayout``: the groups and each rank's share in words."""
    return {
        "hetero/groups": [list(group) for group in layout.groups],
        "hetero/layout": [rank.text for rank in layout.ranks],
    }


def _layout_record(epoch: int, metrics: dict[str, Any]) -> dict[str, Any]:
    keys = ("parallel_mode", "groups", "layout", "resplits", "bytes_per_step")
    return {"epoch": epoch, **{k: metrics[f"hetero/{k}"] for k in keys}}


def _example_input(dataset: Any) -> torch.Tensor:
    import torch

    count = min(_EXAMPLE_SAMPLES, len(dataset))
    return torch.stack([dataset[i]["image"] for i in range(count)])


def _checkpoint_meta(job: JobConfig, workload: Any) -> dict[str, Any]:
    # What the model was trained on (predict checks it against its data).
    return {
        "dataset": job.data.dataset,
        "in_channels": workload.in_channels,
        "num_classes": workload.num_classes,
        "s1_channels": workload.s1_channels,
        "parallel_mode": job.parallel.mode,
    }


def classification_loop(config: dict[str, Any]) -> None:
    """Per-worker loop: carved training in the configured parallel mode, per-epoch validation
    sharded over all ranks by speed (counts summed exactly) and a full-model checkpoint. A ``model.task`` job (a Lightning task) runs
    :func:`~raytrain_hetero.app.lightning_job.lightning_loop` instead."""
    import ray.train
    import torch

    import raytrain_hetero as rh
    from raytrain_hetero.app.datasets import open_worker_data
    from raytrain_hetero.workloads.evaluation import correct_counts

    # validate_config turns validation errors into a ConfigError, which pickles back to the
    # driver (pydantic's errors with custom types do not).
    job = validate_config(config["job"], source="job config on a worker")
    if job.model.task is not None:
        from raytrain_hetero.app.lightning_job import lightning_loop

        lightning_loop(config)
        return
    torch.manual_seed(job.train.seed)
    # Any data.dataset; unreadable files the driver found are left out (cached list).
    workload, datasets, model = open_worker_data(job, ("train", "val"))
    runner: DataParallelRunner | ModelParallelRunner
    if job.parallel.model_parallel:
        runner = ModelParallelRunner(job, model, _example_input(datasets["train"]))
    else:
        runner = DataParallelRunner(job, model)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "model.pt", weights_only=True, map_location="cpu")
        runner.restore(state)
    pin = rh.get_device().type == "cuda"
    if job.data.source == "ray_data":  # decoded by Ray Data tasks, carved by the plan
        loader = rh.get_dataset_shard("train").iter_torch_batches(pin_memory=pin)
    else:
        loader = rh.prepare_data_loader(
            datasets["train"],
            num_workers=job.data.num_workers,
            pin_memory=pin,
            persistent_workers=job.data.num_workers > 0,
        )
    rank = rh.get_rank_info()["rank"]
    for epoch in range(loader.epoch, job.train.epochs):
        runner.start_epoch()
        for batch in loader:
            rh.log_step_metrics(loss=runner.step(batch))
            if rh.checkpoint_due():  # the last step before a node's preemption deadline
                state = runner.full_state()  # collective in the model-parallel modes
                # Not evaluated: NaN ranks it below every scored checkpoint (Ray Train keeps
                # the latest one regardless, which the run resumes from).
                unscored = {"epoch": epoch, "val_accuracy": float("nan")}
                _report_checkpoint(job, workload, state, rank, unscored, epoch)
        metrics: dict[str, Any] = {"epoch": epoch, **runner.layout_metrics()}
        evaluated = runner.evaluation_model()  # collective in the model-parallel modes
        state = runner.full_state()  # idem
        # Every rank validates its speed-proportional shard; counts add up exactly.
        shard = ((b["image"], b["label"]) for b in rh.prepare_eval_data_loader(datasets["val"]))
        correct, seen = rh.sum_across_ranks(*correct_counts(evaluated, shard, rh.get_device()))
        metrics["val_accuracy"] = correct / seen if seen else 0.0
        metrics["hetero/val_samples"] = seen  # over all ranks: each sample once
        # tune.allocation: auto: the allocator learns what this epoch measured before the
        # report (ASHA may stop the trial there); if the trial's workers changed, end this
        # fit after its checkpoint and the trial resumes it on its new workers.
        first_step, called = rh.first_step_time(), config.get("fit_called_at")
        fit_start = first_step - called if first_step is not None and called is not None else None
        if fit_start is not None:
            # The fit's call to its first step (Ray Train's start, the library's, the restore).
            metrics["hetero/fit_start_s"] = fit_start
        moves = epoch_end_moves(
            config.get("allocation"),
            epoch + 1,
            final=epoch + 1 >= job.train.epochs,
            fit_start_s=fit_start,
        )
        _report_checkpoint(job, workload, state, rank, metrics, epoch)
        if moves:
            return


def _report_checkpoint(
    job: JobConfig,
    workload: Any,
    state: tuple[dict[str, Any], dict[str, Any]],
    rank: int,
    metrics: dict[str, Any],
    epoch: int,
) -> None:
    """Every rank reports ``metrics``; rank 0 with a full-model checkpoint of ``state``."""
    import ray.train
    import torch

    import raytrain_hetero as rh

    if rank != 0:
        rh.report(metrics)
        return
    model_state, optimizer_state = state
    with tempfile.TemporaryDirectory() as directory:
        torch.save(
            {
                "model": model_state,
                "optimizer": optimizer_state,
                "meta": _checkpoint_meta(job, workload),
            },
            Path(directory) / "model.pt",
        )
        if "hetero/layout" in metrics:  # the driver's progress view shows it
            atomic_write_json(Path(directory) / LAYOUT_FILE, _layout_record(epoch, metrics))
        rh.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
