"""Evaluation and prediction sharded by speed (worker.evaluation): the shard sampler, the
emulated stretch, and on 3 uneven gloo ranks exact aggregation against one device (counts,
torchmetrics' own sync, Lightning's validate/predict with ``sync_dist``)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from cpu_time import burn
from gloo_group import run_gloo_group
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.data.evaluation import EvaluationLoader, ShardBatchSampler
from raytrain_hetero.worker.measure.clock import ComputeClock

SHARES = (4.0, 2.0, 1.0)  # speeds 1, 1/2, 1/4
SAMPLES, BATCH, CLASSES = 101, 14, 4  # 7 full steps and a short one of 3


def _shards(source, shares, batch_size):
    return {
        rank: list(
            ShardBatchSampler(source, batch_size=batch_size, rank=rank, shares=lambda: shares)
        )
        for rank in range(len(shares))
    }


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 400),
    shares=st.lists(st.floats(0.05, 20.0), min_size=1, max_size=5),
    batch_size=st.integers(1, 64),
)
def test_every_item_once_same_steps_everywhere_shares_by_speed(size, shares, batch_size):
    if size < len(shares):
        with pytest.raises(ConfigError, match="fewer than workers"):
            _shards(size, tuple(shares), batch_size)
        return
    shards = _shards(size, tuple(shares), batch_size)
    items = sorted(i for batches in shards.values() for batch in batches for i in batch)
    assert items == list(range(size))  # every item exactly once
    assert len({len(batches) for batches in shards.values()}) == 1  # same steps on every rank
    assert all(batch for batches in shards.values() for batch in batches)  # never empty
    steps = len(shards[0])
    for rank, batches in shards.items():
        ideal = size * shares[rank] / sum(shares)
        # Per step: rounding (< 1 item) and min-slice bumps (< 1 item per other rank).
        assert abs(sum(map(len, batches)) - ideal) <= len(shares) * steps


def test_a_sampler_source_is_sharded_in_its_order_and_shares_are_read_per_iteration():
    boxes = [f"box{i}" for i in range(10)]  # e.g. torchgeo's GridGeoSampler boxes
    shares = [(1.0, 1.0)]
    sampler = ShardBatchSampler(boxes, batch_size=4, rank=0, shares=lambda: shares[0])
    assert list(sampler) == [["box0", "box1"], ["box4", "box5"], ["box8"]]
    shares[0] = (3.0, 1.0)  # a new plan: the next pass follows it, the step count does not
    assert list(sampler) == [["box0", "box1", "box2"], ["box4", "box5", "box6"], ["box8"]]
    assert len(sampler) == 3


def test_emulation_stretches_the_compute_on_each_batch(one_thread):
    factor, per_batch, batches = 3.0, 0.03, 4
    loader = EvaluationLoader(
        list(range(batches)),
        source=batches,
        batch_size=1,
        rank=0,
        shares=lambda: (1.0,),
        clock=ComputeClock(torch.device("cpu")),
        slowdown=lambda: factor,
    )
    start_wall, start_cpu = time.perf_counter(), time.thread_time()
    for _ in loader:
        burn(per_batch)
    wall, cpu = time.perf_counter() - start_wall, time.thread_time() - start_cpu
    # The slower device's time: k x the own compute (interference only ever adds to it).
    assert wall >= 0.9 * factor * cpu


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    wrong = torch.rand(SAMPLES, generator=g) < 0.35
    predicted = torch.where(wrong, (labels + 1) % CLASSES, labels)
    images = torch.randn(SAMPLES, 2, 3, 3, generator=g)
    images[:, 0, 0, 0] = predicted.float()
    return images, labels


class _Items(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.images, self.labels = _data()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "label": self.labels[index], "index": index}


def _logits(images: torch.Tensor) -> torch.Tensor:
    """A known classifier: class ``x[0, 0, 0]``, confidence from another pixel."""
    cls = images[:, 0, 0, 0].long() % CLASSES
    return torch.nn.functional.one_hot(cls, CLASSES).float() * (1 + images[:, 1, 1, 1:2].abs())


class _Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(x) * self.scale


def _metrics():
    from torchmetrics.classification import MulticlassAccuracy, MulticlassAUROC

    # Sum states (accuracy) and concatenated states of uneven length (exact AUROC).
    return MulticlassAccuracy(CLASSES, average="micro"), MulticlassAUROC(CLASSES, thresholds=None)


def _module():
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _Classifier()
            self.accuracy = _metrics()[0]
            self.seen: list[int] = []

        def validation_step(self, batch, batch_idx):
            logits = self.net(batch["image"])
            n = len(batch["label"])
            self.seen.extend(batch["index"].tolist())
            loss = torch.nn.functional.cross_entropy(logits, batch["label"])
            self.log("val_loss", loss, sync_dist=True, batch_size=n)
            # A per-step collective: safe only if every rank runs the same number of steps.
            self.log("val_step_n", float(n), on_step=True, on_epoch=False, sync_dist=True)
            self.accuracy(logits, batch["label"])
            self.log("val_acc", self.accuracy, batch_size=n)

        def predict_step(self, batch, batch_idx):
            return batch["index"]

    return Module()


def _rank_main(rank: int, world_size: int) -> dict:
    import lightning.pytorch as pl

    import raytrain_hetero as rh
    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import BatchConfig, WorkerSpec
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity
    from raytrain_hetero.workloads.evaluation import correct_counts

    setup = HeteroSetup(
        run_id="sharded-eval",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
        batch=BatchConfig(global_batch_size=BATCH),
    )
    install_runtime(
        WorkerRuntime.start(RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world_size))
    )
    rh.update_plan(shares=list(SHARES), reason="test")  # the plan evaluation follows
    dataset = _Items()

    # The job's path: counts of this rank's shard, summed over the ranks.
    loader = rh.prepare_eval_data_loader(dataset, batch_size=BATCH)
    batches = [(b["image"], b["label"]) for b in loader]
    local = correct_counts(_Classifier(), batches, "cpu")
    total = rh.sum_across_ranks(*local)
    # torchmetrics' own sync (the default sync_on_compute) over the uneven shards.
    metrics = _metrics()
    for images, labels in batches:
        for metric in metrics:
            metric.update(_logits(images), labels)
    synced = [float(metric.compute()) for metric in metrics]

    # Lightning: validate and predict through HeteroDDPStrategy.
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = _module()
    trainer.validate(module, dataloaders=DataLoader(dataset, batch_size=BATCH), verbose=False)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    predicted = trainer.predict(module, dataloaders=DataLoader(dataset, batch_size=BATCH))
    return {
        "local": local,
        "total": total,
        "steps": len(batches),
        "synced": synced,
        "logged": logged,
        "validated": module.seen,
        "predicted": torch.cat(predicted).tolist(),
    }


def test_three_uneven_ranks_aggregate_exactly_as_one_device():
    by_rank = run_gloo_group(_rank_main, len(SHARES), timeout_s=300)
    images, labels = _data()
    logits = _logits(images)
    correct = int((logits.argmax(1) == labels).sum())
    _, auroc = _metrics()
    expected_auroc = float(auroc(logits, labels))
    expected_loss = float(torch.nn.functional.cross_entropy(logits, labels))
    seen = [by_rank[r]["local"][1] for r in range(len(SHARES))]
    assert sum(seen) == SAMPLES and seen[0] > seen[1] > seen[2]  # shares 4:2:1, uneven
    assert np.allclose(np.array(seen) / SAMPLES, np.array(SHARES) / sum(SHARES), atol=0.03)
    assert len({result["steps"] for result in by_rank.values()}) == 1
    for rank in (1, 2):  # the Lightning loaders shard alike
        assert len(by_rank[rank]["validated"]) == seen[rank]
    for collected in ("validated", "predicted"):
        items = sorted(i for result in by_rank.values() for i in result[collected])
        assert items == list(range(SAMPLES)), collected  # every item exactly once
    for result in by_rank.values():
        assert result["total"] == (correct, SAMPLES)
        assert result["synced"][0] == pytest.approx(correct / SAMPLES, abs=1e-7)
        assert result["synced"][1] == pytest.approx(expected_auroc, abs=1e-6)
        assert result["logged"]["val_acc"] == pytest.approx(correct / SAMPLES, abs=1e-7)
        # Means over uneven shards: value x batch size and batch sizes summed, not averaged.
        assert result["logged"]["val_loss"] == pytest.approx(expected_loss, rel=1e-5)
    # Averaging the ranks' means equally would be off: the check tells the two apart.
    losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    rank_means = [float(losses[by_rank[r]["validated"]].mean()) for r in range(len(SHARES))]
    assert abs(float(np.mean(rank_means)) - expected_loss) > 1e-3
