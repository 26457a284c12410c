"""Lightning on heterogeneous workers: an unmodified ``LightningModule`` (torchgeo's tasks)
trained by ``HeteroTrainer`` with the core loop's exactness, the way Ray Train's own Lightning
support works (``RayDDPStrategy`` + ``RayLightningEnvironment`` + ``prepare_trainer`` +
``RayTrainReportCallback``)::

    trainer = pl.Trainer(
        max_epochs=3,
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[rhl.HeteroReportCallback()],
        use_distributed_sampler=False,
        enable_checkpointing=False,
    )
    rhl.fit(rhl.prepare_trainer(trainer), task, datamodule=datamodule)

Every part reuses the core (no second sync, sampler or planner): the strategy is
``prepare_model`` + the guarded optimizer + ``prepare_data_loader`` over the training
dataset (a ``GeoDataset`` is carved by its sampler's draws, :func:`geo_draws`); a step
callback ends each step into the scheduler, metrics and guard (and checkpoints at the step
agreed after a preemption notice); :class:`HeteroReportCallback` checkpoints at epoch ends and
:func:`fit` resumes, mid-epoch too. Evaluation loaders are shared out by speed.
Not exact, by design: training-step ``self.log`` metrics describe the rank's slice. See
docs/how-to/torchgeo.md.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import ray
import ray.train
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import BatchSampler, DataLoader

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker import api
from raytrain_hetero.worker.data.evaluation import EvaluationLoader
from raytrain_hetero.worker.data.sampler import EpochDraws, HeteroDataLoader
from raytrain_hetero.worker.runtime.registry import get_runtime

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_NAME",
    "HeteroDDPStrategy",
    "HeteroLightningEnvironment",
    "HeteroReportCallback",
    "HeteroStepCallback",
    "fit",
    "geo_draws",
    "prepare_trainer",
]

#: The Lightning checkpoint's file name inside a reported Ray checkpoint (Ray's own name).
CHECKPOINT_NAME = "checkpoint.ckpt"
#: ``DDPStrategy`` arguments the run owns (its process group and count-weighted hook).
_RUN_OWNED_DDP_ARGS = (
    "ddp_comm_hook",
    "ddp_comm_state",
    "ddp_comm_wrapper",
    "process_group_backend",
)


def _ray_context_value(method: str) -> int:
    """Local/node rank from Ray Train's context; 0 outside a Ray Train worker."""
    try:
        return int(getattr(ray.train.get_context(), method)())
    except RuntimeError:
        return 0


class HeteroLightningEnvironment(LightningEnvironment):
    """Lightning's view of the worker group: ranks and world size of the HeteroTrainer run.

    The process group exists already (the backend made it), so Lightning launches nothing.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return get_runtime().identity.world_size

    def global_rank(self) -> int:
        return get_runtime().identity.rank

    def local_rank(self) -> int:
        return _ray_context_value("get_local_rank")

    def node_rank(self) -> int:
        return _ray_context_value("get_node_rank")

    def set_world_size(self, size: int) -> None:
        pass  # fixed by the worker group

    def set_global_rank(self, rank: int) -> None:
        pass  # fixed by the worker group

    def teardown(self) -> None:
        pass  # the process group belongs to the backend


class HeteroDDPStrategy(DDPStrategy):
    """Lightning DDP with exact count-weighted gradients over uneven per-worker slices.

    Args:
        sync_batchnorm: True: BatchNorm layers become global-statistics HeteroBatchNorm;
            False: per-slice statistics (inexact under uneven slices); None: the run's
            ``BatchConfig.batchnorm`` (``ghost``: GhostBatchNorm over whole groups of
            ``ghost_size``, the slices planned in whole groups).
        dataloader_kwargs: Extra arguments for the carved training loader (``pin_memory``,
            ``persistent_workers``...); ``num_workers`` and ``collate_fn`` come from the
            datamodule's loader unless given here.
        **kwargs: ``DDPStrategy`` arguments (``find_unused_parameters``...); the process
            group, its backend and the communication hook are the run's.
    """

    def __init__(
        self,
        *,
        sync_batchnorm: bool | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        refused = [k for k in _RUN_OWNED_DDP_ARGS if kwargs.get(k) is not None]
        if refused:
            raise ConfigError(
                f"HeteroDDPStrategy got {', '.join(refused)}: the run's process group and its "
                "count-weighted gradient hook are fixed. Fix: drop these arguments."
            )
        super().__init__(**kwargs)
        self._hetero_sync_batchnorm = sync_batchnorm
        self._hetero_loader_kwargs = dict(dataloader_kwargs or {})
        self.hetero_loader: HeteroDataLoader | None = None
        self._hetero_dataset: Any = None

    @property
    def root_device(self) -> torch.device:
        return api.get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
        return api.prepare_model(
            model, sync_batchnorm=self._hetero_sync_batchnorm, ddp_kwargs=dict(self._ddp_kwargs)
        )

    def _register_ddp_hooks(self) -> None:
        pass  # prepare_model registered the count-weighted hook

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        super().setup_optimizers(trainer)
        self.optimizers = [api.prepare_optimizer(optimizer) for optimizer in self.optimizers]

    def optimizer_step(
        self,
        optimizer: Any,
        closure: Any,
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        # Lightning runs forward and backward inside optimizer.step(closure); the step guard
        # must decide after the gradients were reduced, so the closure runs first.
        result = closure()
        return super().optimizer_step(optimizer, lambda: result, model, **kwargs)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        # Lightning's epoch mean divides the all-reduced sums of value x batch size and of
        # batch sizes; an integer mean truncates the latter (101 samples on 3 ranks: 33, not
        # 33.67), which equal padded shards never show but uneven shards do.
        integer = isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()
        if integer and reduce_op in ("mean", "avg"):
            tensor = tensor.double()
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or not trainer.training:
            return self._sharded_loader(dataloader)  # validation / test / predict
        return self._carved_loader(dataloader)

    def _sharded_loader(self, dataloader: object) -> object:
        """This rank's speed-proportional share of an evaluation loader's items (each item on
        one rank; the loader's batch size is the step's size over all ranks)."""
        if isinstance(dataloader, EvaluationLoader):
            return dataloader
        # A plain BatchSampler, or Lightning's predict wrapper (it copies its attributes).
        batches = getattr(dataloader, "batch_sampler", None)
        sampler, size = getattr(batches, "sampler", None), getattr(batches, "batch_size", None)
        if not isinstance(dataloader, DataLoader) or sampler is None or not size:
            raise ConfigError(
                f"HeteroDDPStrategy shares evaluation data out by speed, over a DataLoader "
                f"with a batch_size and a sampler, not {type(dataloader).__name__} "
                f"(batch_sampler {type(batches).__name__}). Fix: return "
                "DataLoader(dataset, batch_size=..., sampler=...) from the *_dataloader hook."
            )
        kwargs: dict[str, Any] = {
            "num_workers": dataloader.num_workers,
            "collate_fn": dataloader.collate_fn,
            "pin_memory": dataloader.pin_memory,
        }
        return api.prepare_eval_data_loader(
            dataloader.dataset, batch_size=size, sampler=sampler, **kwargs
        )

    def _carved_loader(self, dataloader: object) -> HeteroDataLoader:
        if isinstance(dataloader, HeteroDataLoader):
            # Lightning counts an epoch's batches itself (restored from a mid-epoch checkpoint
            # with the batches already done): its length is the whole epoch.
            dataloader.len_counts_whole_epoch = True
            self.hetero_loader = dataloader
            return dataloader
        if not isinstance(dataloader, DataLoader):
            raise ConfigError(
                f"HeteroDDPStrategy carves a torch DataLoader's dataset, not a "
                f"{type(dataloader).__name__}. Fix: return a DataLoader over a map-style dataset "
                "from train_dataloader(), or pass raytrain_hetero.prepare_data_loader(dataset)."
            )
        if self.hetero_loader is not None and dataloader.dataset is self._hetero_dataset:
            return self.hetero_loader  # reloaded dataloader: keep the cursor and plans
        if self.hetero_loader is not None:
            raise ConfigError(
                "The training dataset changed during fit (reload_dataloaders_every_n_epochs): "
                "the carving covers one fixed dataset. Fix: keep one training dataset."
            )
        dataset = (
            geo_draws(dataloader, get_runtime().identity.setup.batch.seed) or dataloader.dataset
        )
        kwargs: dict[str, Any] = {
            "num_workers": dataloader.num_workers,
            "collate_fn": dataloader.collate_fn,
        }
        if dataloader.num_workers > 0:
            kwargs["persistent_workers"] = dataloader.persistent_workers
        kwargs.update(self._hetero_loader_kwargs)
        loader = api.prepare_data_loader(dataset, move_to_device=False, **kwargs)
        loader.len_counts_whole_epoch = True  # as above
        self.hetero_loader, self._hetero_dataset = loader, dataloader.dataset
        logger.info(
            "training dataloader replaced by the carved loader (%d steps per epoch)",
            loader.steps_per_epoch,
        )
        return loader


def geo_draws(dataloader: DataLoader, seed: int) -> EpochDraws | None:
    """The training draws of a loader over a torchgeo ``GeoDataset`` (None for other datasets).

    A GeoDataset is read by the queries its sampler yields (the loader's ``batch_sampler``,
    e.g. ``RandomBatchGeoSampler``, or its ``sampler``, e.g. ``RandomGeoSampler`` or
    ``GridGeoSampler``, batched by torch): the carving takes each epoch's draws of it.
    """
    from torchgeo.datasets import GeoDataset

    if not isinstance(dataloader.dataset, GeoDataset):
        return None
    source: Any = dataloader.batch_sampler
    if isinstance(source, BatchSampler):  # torch's batching of a flat GeoSampler
        source = source.sampler
    return EpochDraws(dataloader.dataset, source, seed=seed)


class HeteroStepCallback(pl.Callback):
    """Ends each carved step after its optimizer update (added by :func:`prepare_trainer`).

    The step's record (slice, weight, timings, ``loss``) goes to the core loop's machinery:
    the scheduler (live re-planning at the agreed step, a collective every
    ``plan_sync_every`` steps on every rank) and the Ray metrics.

    At the step agreed after a preemption notice
    (:func:`~raytrain_hetero.worker.api.checkpoint_due`), it first checkpoints and reports
    as :class:`HeteroReportCallback` does at an epoch end (its metrics if the Trainer has
    one), mid-epoch: the group then hands off when the step ends, and :func:`fit` resumes
    at the next step (Lightning's loop progress and the sampler cursor, saved together).
    """

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loader = _strategy(trainer).hetero_loader
        if loader is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            api.log_step_metrics(loss=float(loss.detach()))
        if api.checkpoint_due():  # before the step ends: the hand-off checks this report
            reporter = next(
                (cb for cb in trainer.callbacks if isinstance(cb, HeteroReportCallback)), None
            )
            metrics = (reporter or HeteroReportCallback()).collect_metrics(trainer)
            logger.info("preemption: checkpointing at step %d", api.current_step_number())
            _report_with_checkpoint(trainer, metrics)
        loader.finish_step()


class HeteroReportCallback(pl.Callback):
    """Reports ``trainer.callback_metrics`` with a checkpoint at the end of training epochs.

    Every rank calls :func:`~raytrain_hetero.worker.api.report` (the rank figures are
    gathered); rank 0 attaches the checkpoint: Lightning's ``checkpoint.ckpt`` plus the
    sampler cursor and plan history, which :func:`fit` resumes from.

    Args:
        every_n_epochs: Report (and checkpoint) every this many epochs, and at the last.
    """

    def __init__(self, every_n_epochs: int = 1) -> None:
        super().__init__()
        if every_n_epochs < 1:
            raise ConfigError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        self.every_n_epochs = every_n_epochs

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch
        last = trainer.max_epochs is not None and epoch + 1 >= trainer.max_epochs
        if (epoch + 1) % self.every_n_epochs and not last:
            return
        _report_with_checkpoint(trainer, self.collect_metrics(trainer))

    def collect_metrics(self, trainer: pl.Trainer) -> dict[str, Any]:
        """What to report: epoch, step and every scalar of ``trainer.callback_metrics``."""
        metrics: dict[str, Any] = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        for key, value in trainer.callback_metrics.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                metrics[key] = float(value.detach())
        return metrics


def _report_with_checkpoint(trainer: pl.Trainer, metrics: dict[str, Any]) -> None:
    """Save Lightning's checkpoint (a barrier on all ranks) and report it, on every rank;
    rank 0 attaches it (``report`` adds the sampler cursor and plan history)."""
    with tempfile.TemporaryDirectory() as directory:
        trainer.save_checkpoint(Path(directory) / CHECKPOINT_NAME)
        checkpoint = None
        if trainer.global_rank == 0:
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        api.report(metrics, checkpoint=checkpoint)


def _strategy(trainer: pl.Trainer) -> HeteroDDPStrategy:
    strategy = trainer.strategy
    if not isinstance(strategy, HeteroDDPStrategy):
        raise ConfigError(
            f"The Trainer's strategy is {type(strategy).__name__}. Fix: "
            "pl.Trainer(strategy=raytrain_hetero.lightning.HeteroDDPStrategy(), ...)."
        )
    return strategy


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check a Trainer for heterogeneous training and add the step callback.

    Raises:
        ConfigError: Naming the setting to change: a strategy other than
            :class:`HeteroDDPStrategy`, Lightning's distributed sampler, gradient
            accumulation, epochs cut short (``limit_train_batches``, ``overfit_batches``),
            or a cluster environment other than :class:`HeteroLightningEnvironment`.
    """
    strategy = _strategy(trainer)
    if not isinstance(strategy.cluster_environment, HeteroLightningEnvironment):
        raise ConfigError(
            f"The strategy's cluster environment is "
            f"{type(strategy.cluster_environment).__name__}. Fix: "
            "pl.Trainer(plugins=[raytrain_hetero.lightning.HeteroLightningEnvironment()], ...)."
        )
    if trainer._accelerator_connector.use_distributed_sampler:
        raise ConfigError(
            "The Trainer inserts Lightning's DistributedSampler, which splits every batch "
            "evenly. Fix: pl.Trainer(use_distributed_sampler=False, ...)."
        )
    if trainer.accumulate_grad_batches != 1:
        raise ConfigError(
            f"accumulate_grad_batches={trainer.accumulate_grad_batches}: every carved step is "
            "one optimizer update of global_batch_size samples. Fix: drop it and raise "
            "global_batch_size instead."
        )
    if trainer.limit_train_batches not in (1.0, None) or trainer.overfit_batches:
        raise ConfigError(
            f"limit_train_batches={trainer.limit_train_batches}, overfit_batches="
            f"{trainer.overfit_batches}: an epoch ends early, but the carving's epoch covers "
            "the whole dataset (every sample once). Fix: drop them; stop with max_steps, or "
            "train on a smaller dataset."
        )
    if not any(isinstance(cb, HeteroStepCallback) for cb in trainer.callbacks):
        trainer.callbacks.append(HeteroStepCallback())
    return trainer


@contextmanager
def resume_checkpoint_path() -> Iterator[str | None]:
    """The Lightning checkpoint of ``ray.train.get_checkpoint()``, or None (a fresh run)."""
    try:
        checkpoint = ray.train.get_checkpoint()
    except RuntimeError:  # outside a Ray Train worker: nothing to resume
        checkpoint = None
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, CHECKPOINT_NAME)
        if not os.path.exists(path):
            raise ConfigError(
                f"The run's checkpoint {checkpoint.path} holds no {CHECKPOINT_NAME}: it was "
                "not written by HeteroReportCallback. Fix: start the run under a new name."
            )
        yield path


def fit(trainer: pl.Trainer, model: pl.LightningModule, **fit_kwargs: Any) -> None:
    """``trainer.fit(model, ...)`` resuming from the run's latest checkpoint if there is one."""
    with resume_checkpoint_path() as path:
        if path is not None:
            logger.info("resuming Lightning from %s", path)
        trainer.fit(model, ckpt_path=path, **fit_kwargs)
