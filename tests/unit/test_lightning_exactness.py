"""torchgeo's ClassificationTask under a real Lightning Trainer on 3 uneven gloo ranks (no Ray).

Ranks 0/1/2 take slices 5/3/2 of the first global batch of 10, then (a plan switch agreed in
a Lightning callback, as the scheduler sync does) 2/3/5 of the next ones, through
:class:`~raytrain_hetero.worker.lightning.HeteroDDPStrategy` (count-weighted gradient hook,
exact HeteroBatchNorm in the ResNet, the carving loader, the guarded AdamW). After N steps the
parameters and BatchNorm buffers equal those of the same task trained by a one-device Trainer
on the same global batches (float32, <= 1e-4), and each step's reduced gradient equals the
one-device gradient. The loader here is built from the runtime's parts as
``prepare_data_loader`` builds it (that one also reads Ray Train's checkpoint, which needs a
Ray Train worker: the HeteroTrainer integration test covers it).
"""

from __future__ import annotations

import torch
from gloo_group import run_gloo_group
from torch.utils.data import DataLoader, Dataset, default_collate

from raytrain_hetero.config import BatchConfig

SLICES = (5, 3, 2)
BATCH = sum(SLICES)
SWITCHED = (2, 3, 5)  # the plan from the second step on
SAMPLES = 30  # 3 steps per epoch
STEPS = 3
CHANNELS, CLASSES, SIZE = 4, 3, 16
TOLERANCE = 1e-4
#: The first step's reduced gradient against the one-device one, relative to its largest entry
#: (uniform averaging of the 5/3/2 slices instead is off by ~10%).
GRADIENT_RTOL = 1e-4
#: AdamW's first updates are about lr * sign(g): float32 reduction-order noise on entries whose
#: gradient is ~0 flips signs and moves them by up to 2 * lr, on one device with another thread
#: count too. A small lr keeps that noise under TOLERANCE; the gradient checks stay strict.
LR = 1e-5


class _Scenes(Dataset):
    """Class-dependent channel means plus noise: a learnable, deterministic dataset."""

    def __init__(self, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (count,), generator=g)
        means = torch.linspace(-1.0, 1.0, CLASSES * CHANNELS).reshape(CLASSES, CHANNELS)
        noise = torch.randn(count, CHANNELS, SIZE, SIZE, generator=g)
        self.images = means[self.labels][:, :, None, None] + noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "label": self.labels[index]}


def _task():
    from torchgeo.trainers import ClassificationTask

    torch.manual_seed(0)
    return ClassificationTask(
        model="resnet18", weights=None, in_channels=CHANNELS, num_classes=CLASSES, lr=LR
    )


class _SwitchPlan:
    """Lightning callback: after the first step, every rank switches to shares 2/3/5 (the
    collective the scheduler sync also makes), so the later steps run under a new plan."""

    def __new__(cls):
        import lightning.pytorch as pl

        class Switch(pl.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                if batch_idx == 0:
                    import raytrain_hetero as rh

                    rh.update_plan(shares=[float(s) for s in SWITCHED], reason="test")

        return Switch()


class _GradientLog:
    """Lightning callback: the (reduced) gradients right before every optimizer step."""

    def __new__(cls):
        import lightning.pytorch as pl

        class Log(pl.Callback):
            def __init__(self) -> None:
                self.steps: list[list[torch.Tensor]] = []

            def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
                self.steps.append(
                    [p.grad.detach().clone() for p in pl_module.parameters() if p.grad is not None]
                )

        return Log()


def _trainer_kwargs() -> dict:
    return dict(
        accelerator="cpu",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def _carved_loader(dataset: Dataset, records: list, batch_size: int = BATCH):
    """The loader ``prepare_data_loader`` builds, from this process's runtime (no Ray)."""
    from raytrain_hetero.core.carving import Cursor, EpochCarver
    from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
    from raytrain_hetero.worker.measure.probe import default_probe_loss
    from raytrain_hetero.worker.plan.calibration import ProbeInputs
    from raytrain_hetero.worker.runtime import plan_flow
    from raytrain_hetero.worker.runtime.registry import get_runtime

    runtime = get_runtime()
    setup = runtime.identity.setup
    batch = setup.batch
    carver = EpochCarver(
        len(dataset), batch_size, batch.seed, setup.max_world_size * batch.min_slice_samples
    )
    runtime.loader = LoaderState(carver, Cursor(0, 0))
    inputs = ProbeInputs(dataset, default_collate, default_probe_loss, True)

    def ensure_plan() -> None:
        if runtime.plans.current is None:
            plan_flow.install_first_plan(runtime, inputs)

    return HeteroDataLoader(
        dataset,
        state=runtime.loader,
        schedule=runtime.plans.schedule,
        identity=runtime.identity,
        timing=runtime.timing,
        telemetry=runtime.telemetry,
        ensure_plan=ensure_plan,
        on_step_end=lambda record: (records.append(record), plan_flow.on_step_end(runtime, record)),
        move_to_device=False,
    )


def _rank_main(rank: int, world_size: int) -> dict:
    import lightning.pytorch as pl

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    setup = HeteroSetup(
        run_id="lightning",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
        batch=BatchConfig(
            global_batch_size=BATCH, fixed_shares=tuple(float(s) for s in SLICES), seed=7
        ),
    )
    identity = RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world_size)
    install_runtime(WorkerRuntime.start(identity))
    task = _task()
    log = _GradientLog()
    records: list = []
    trainer = pl.Trainer(
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        use_distributed_sampler=False,
        callbacks=[log, _SwitchPlan()],
        **_trainer_kwargs(),
    )
    rhl.prepare_trainer(trainer)
    loader = _carved_loader(_Scenes(SAMPLES, seed=1), records)
    trainer.fit(task, train_dataloaders=loader, val_dataloaders=_val_loader())
    runtime = get_runtime()
    return {
        "state": {k: v.detach().clone() for k, v in trainer.lightning_module.state_dict().items()},
        "grads": log.steps,
        "slices": [r.slice for r in records],
        "plans": [r.plan_version for r in records],
        "steps": [r.step for r in records],
        "losses": [r.loss for r in records],
        "bn": sorted({type(m).__name__ for m in task.modules() if "Norm" in type(m).__name__}),
        "cursor": (runtime.loader.cursor.epoch, runtime.loader.cursor.step_in_epoch),
        "permutation": runtime.loader.carver.permutation(0).tolist(),
    }


def _val_loader() -> DataLoader:
    return DataLoader(_Scenes(6, seed=2), batch_size=6)


def _one_device(permutation: list[int]) -> dict:
    """The same task on one device over the same global batches, in the same order."""
    import lightning.pytorch as pl

    batches = [permutation[k * BATCH : (k + 1) * BATCH] for k in range(STEPS)]
    loader = DataLoader(_Scenes(SAMPLES, seed=1), batch_sampler=batches)
    task = _task()
    log = _GradientLog()
    trainer = pl.Trainer(devices=1, callbacks=[log], **_trainer_kwargs())
    trainer.fit(task, train_dataloaders=loader, val_dataloaders=_val_loader())
    return {"state": task.state_dict(), "grads": log.steps}


def test_three_uneven_workers_match_one_device():
    by_rank = run_gloo_group(_rank_main, len(SLICES), timeout_s=480)
    reference = _one_device(by_rank[0]["permutation"])
    for rank, result in by_rank.items():
        # The switch took effect at the next uncarved step, on every rank alike.
        assert result["slices"] == [SLICES[rank]] + [SWITCHED[rank]] * (STEPS - 1)
        assert result["plans"] == [1, 2, 2]
        assert result["steps"] == list(range(STEPS))
        assert all(loss == loss for loss in result["losses"])  # each step logged its loss
        assert result["bn"] == ["HeteroBatchNorm"]
        assert result["cursor"] == (1, 0)
        assert len(result["grads"]) == STEPS
        # The first update's reduced gradient is the one-device gradient (later ones inherit
        # AdamW's sign noise, see LR).
        for got, want in zip(result["grads"][0], reference["grads"][0]):
            scale = want.abs().max().item()
            assert (got - want).abs().max().item() <= GRADIENT_RTOL * scale + 1e-9
        assert result["state"].keys() == reference["state"].keys()
        for key, want in reference["state"].items():
            got = result["state"][key]
            if want.is_floating_point():
                assert (got - want).abs().max().item() <= TOLERANCE, key
            else:
                assert torch.equal(got, want), key
    # The states moved: the comparison is not between two untouched initialisations.
    moved = _task().state_dict()
    assert any(
        (reference["state"][k] - v).abs().max() > 2 * LR
        for k, v in moved.items()
        if v.is_floating_point()
    )


GHOST_SHARES, GHOST_BATCH, GHOST_SAMPLES, GHOST_STEPS = (1.0, 2.0, 3.0), 12, 36, 6


def _ghost_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


def _ghost_data():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(GHOST_SAMPLES, 6, generator=gen) * 2 + 1
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (GHOST_SAMPLES,), generator=gen))


def _ghost_rank(rank: int, world_size: int) -> dict:
    """HeteroDDPStrategy under batchnorm: ghost (groups of 2), slices 2/4/6, 6 SGD steps."""
    import lightning.pytorch as pl

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _ghost_model()

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    setup = HeteroSetup(
        run_id="lightning-ghost",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
        batch=BatchConfig(
            global_batch_size=GHOST_BATCH, fixed_shares=GHOST_SHARES, seed=7,
            batchnorm="ghost", ghost_size=2,
        ),
    )  # fmt: skip
    identity = RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world_size)
    install_runtime(WorkerRuntime.start(identity))
    task, records = Task(), []
    kwargs = {**_trainer_kwargs(), "max_steps": GHOST_STEPS}
    trainer = pl.Trainer(
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        use_distributed_sampler=False,
        **kwargs,
    )
    rhl.prepare_trainer(trainer)
    trainer.fit(task, train_dataloaders=_carved_loader(_ghost_data(), records, GHOST_BATCH))
    carver = get_runtime().loader.carver
    return {
        "state": {k: v.detach().clone() for k, v in task.net.state_dict().items()},
        "slices": [r.slice for r in records],
        "bn": sorted({type(m).__name__ for m in task.modules() if "Norm" in type(m).__name__}),
        "permutations": [carver.permutation(e).tolist() for e in range(2)],
    }


def test_lightning_ghost_batchnorm_matches_one_device_ghost():
    """The Lightning strategy under batchnorm: ghost: GhostBatchNorm layers, slices in whole
    groups, and the parameters and running statistics of one device running ghost BatchNorm
    over the same global batches."""
    from raytrain_hetero.worker.sync.batchnorm.convert import convert_ghost_batchnorm

    by_rank = run_gloo_group(_ghost_rank, len(GHOST_SHARES), timeout_s=300)
    model = convert_ghost_batchnorm(_ghost_model(), 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _ghost_data().tensors
    steps_per_epoch = GHOST_SAMPLES // GHOST_BATCH
    for step in range(GHOST_STEPS):
        epoch, k = divmod(step, steps_per_epoch)
        ids = by_rank[0]["permutations"][epoch][k * GHOST_BATCH : (k + 1) * GHOST_BATCH]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[ids]), y[ids]).backward()
        optimizer.step()
    for rank, result in by_rank.items():
        assert result["bn"] == ["GhostBatchNorm"]
        assert result["slices"] == [(2, 4, 6)[rank]] * GHOST_STEPS
        for key, want in model.state_dict().items():
            got = result["state"][key]
            assert (got.double() - want.double()).abs().max().item() <= 1e-5, (rank, key)
    assert model[1].num_batches_tracked.item() == GHOST_STEPS
