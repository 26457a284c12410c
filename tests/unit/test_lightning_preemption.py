"""The Lightning path's preemption hand-off on 2 real gloo ranks, no Ray.

A Lightning Trainer with ``HeteroDDPStrategy`` (the strategy carves a plain DataLoader through
``prepare_data_loader``, as in a HeteroTrainer run) trains 2 epochs of 5 steps. A hand-off at
step ``L`` is agreed (the decision ``read_notice`` broadcasts after a notice, set here), so
``HeteroStepCallback`` checkpoints at ``L`` mid-epoch and the step's end raises
``PreemptionHandoff`` through the scheduler path every run takes. A second Trainer resumes
with ``rhl.fit`` from that checkpoint. Checked against one uninterrupted Trainer: the
resumed run starts at step ``L + 1`` with Lightning's ``global_step`` and ``batch_idx`` in
step, runs every later step once, ends each epoch once at its carved end, and finishes
with the same parameters. Ray Train's ``report`` / ``get_checkpoint`` are replaced by a
store in a folder (the Ray run: tests/integration/test_preemption.py).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from gloo_group import run_gloo_group

SAMPLES, BATCH, SHARES, EPOCHS = 40, 8, (1.0, 3.0), 2
STEPS_PER_EPOCH = SAMPLES // BATCH  # 5
TOTAL = EPOCHS * STEPS_PER_EPOCH
#: Mid-epoch 0, mid-epoch 1 (a resume in a later epoch) and epoch 0's last step.
LAST_STEPS = (2, 6, 4)


def _data() -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 6, generator=gen)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (SAMPLES,), generator=gen))


def _no_actor(name, namespace=None):
    """The scheduler actor's lookup when there is none: the client keeps its records and
    polls answer None (fixed shares: no live plans), as when the actor is unreachable."""
    raise ValueError(f"no actor {name}")


def _fit(rank: int, world: int, store: Path, last_step: int | None, resume: Path | None):
    """One Trainer on this rank: a hand-off at ``last_step`` (None: none) and/or a resume."""
    import lightning.pytorch as pl
    import ray.train

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import BatchConfig, WorkerSpec
    from raytrain_hetero.core.preemption import HandoffDecision
    from raytrain_hetero.errors import PreemptionHandoff
    from raytrain_hetero.worker import api
    from raytrain_hetero.worker.plan.scheduler_client import SchedulerClient
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    setup = HeteroSetup(
        run_id="lightning-preempt",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world)),
        batch=BatchConfig(global_batch_size=BATCH, fixed_shares=SHARES, seed=7),
    )
    identity = RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world)
    runtime = WorkerRuntime.start(identity)
    # The real client, with no actor to reach (this test runs without Ray).
    runtime.scheduler = SchedulerClient(
        "absent", None, group_id="g", world_size=world, lookup=_no_actor
    )
    install_runtime(runtime)
    if last_step is not None:
        runtime.preemption.decision = HandoffDecision(last_step, True, 1.0, 10.0)
    reports: list[dict] = []

    def report(metrics, checkpoint=None, **kwargs) -> None:
        step = get_runtime().timing.current  # None at an epoch end
        reports.append({**metrics, "at": None if step is None else step.global_step})
        if checkpoint is not None:  # rank 0 keeps it, as Ray's storage would
            kept = store / f"checkpoint_{len(list(store.glob('checkpoint_*')))}"
            shutil.copytree(checkpoint.path, kept)
            (store / "latest").write_text(str(kept))

    ray.train.report = report
    ray.train.get_checkpoint = lambda: (
        ray.train.Checkpoint.from_directory(str(resume)) if resume is not None else None
    )
    ray.train.get_preemption_info = lambda: None  # the decision is set above
    api._check_same_dataset = lambda runtime, fingerprint: None  # names Ray nodes

    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
            )

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    steps: list[dict] = []
    epoch_ends: list[int] = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            step = get_runtime().timing.current
            steps.append(
                {
                    "step": step.global_step,
                    "epoch": trainer.current_epoch,
                    "carved_epoch": step.epoch,
                    "batch_idx": batch_idx,
                    "step_in_epoch": step.step_in_epoch,
                    "global_step": trainer.global_step,
                }
            )

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            epoch_ends.append(trainer.current_epoch)

    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[Record(), rhl.HeteroReportCallback()],
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    task = Task()
    handed_off = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rhl.fit(rhl.prepare_trainer(trainer), task, train_dataloaders=_loader())
        except PreemptionHandoff:
            handed_off = True
    return {
        "handed_off": handed_off,
        "steps": steps,
        "epoch_ends": epoch_ends,
        "reports": reports,
        "global_step": trainer.global_step,
        "state": {k: v.detach().clone() for k, v in task.state_dict().items()},
        "warnings": [str(w.message) for w in caught],
    }


def _loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(_data(), batch_size=BATCH)


def _rank_main(rank: int, world: int, folder: str) -> dict:
    import torch.distributed as dist

    results = {"reference": _fit(rank, world, Path(folder) / "reference", None, None)}
    for last in LAST_STEPS:
        store = Path(folder) / f"at{last}"
        store.mkdir(exist_ok=True)
        first = _fit(rank, world, store, last, None)
        dist.barrier()
        resume = Path((store / "latest").read_text())
        results[last] = (first, _fit(rank, world, store, None, resume))
    return results


@pytest.fixture(scope="module")
def by_rank(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning_preempt")
    (folder / "reference").mkdir()
    return run_gloo_group(_rank_main, 2, str(folder), timeout_s=480)


def test_reference_run_trains_every_step_once(by_rank):
    for result in by_rank.values():
        reference = result["reference"]
        assert not reference["handed_off"]
        assert [s["step"] for s in reference["steps"]] == list(range(TOTAL))
        assert reference["global_step"] == TOTAL and reference["epoch_ends"] == [0, 1]


@pytest.mark.parametrize("last", LAST_STEPS)
def test_the_hand_off_checkpoints_mid_epoch_and_the_resume_continues_at_the_next_step(
    by_rank, last
):
    for rank, result in by_rank.items():
        first, second = result[last]
        reference = result["reference"]
        # The first Trainer trained to L, checkpointed there (every rank reported, rank 0
        # with the checkpoint and the report callback's metrics) and handed off.
        assert first["handed_off"] and not second["handed_off"]
        assert [s["step"] for s in first["steps"]] == list(range(last + 1))
        preempt = [r for r in first["reports"] if r["at"] == last]
        assert len(preempt) == 1 and preempt[0]["hetero/global_step"] == last + 1
        assert "train_loss" in preempt[0] and preempt[0]["step"] == last + 1
        # The second starts at L + 1 and runs every later step once; Lightning's own
        # counters (global_step, the epoch's batch_idx, current_epoch) match the carving.
        assert [s["step"] for s in second["steps"]] == list(range(last + 1, TOTAL))
        for s in first["steps"] + second["steps"]:
            assert s["global_step"] == s["step"] + 1
            assert (s["epoch"], s["batch_idx"]) == (s["carved_epoch"], s["step_in_epoch"])
        assert second["global_step"] == TOTAL
        # Every epoch's end ran once, where it ends; the one whose last step was L is the
        # exception: the group ended in that step, and the resumed Trainer counts the
        # epoch done (Lightning's restore of a checkpoint written on its last batch).
        ends = first["epoch_ends"] + second["epoch_ends"]
        cut = last // STEPS_PER_EPOCH if (last + 1) % STEPS_PER_EPOCH == 0 else None
        assert ends == [e for e in range(EPOCHS) if e != cut], (rank, ends)
        # Lightning's loop state carries the cursor: no "not resumable" warning.
        assert not [w for w in second["warnings"] if "not resumable" in w]
        # The same parameters (and momentum-driven path) as the uninterrupted Trainer.
        for key, want in reference["state"].items():
            diff = (second["state"][key] - want).abs().max().item()
            assert diff <= 1e-6, (rank, last, key, diff)
    moved = max(
        (by_rank[0]["reference"]["state"][k] - v).abs().max().item()
        for k, v in by_rank[0][LAST_STEPS[0]][0]["state"].items()
    )
    assert moved > 1e-3  # the compared states are not untouched initialisations
