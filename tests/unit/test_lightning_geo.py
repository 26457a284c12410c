"""A user's torchgeo GeoDataModule (one RasterDataset, RandomGeoSampler) under a real Lightning
Trainer on 3 uneven gloo ranks (no Ray), against one device.

The datamodule is written as a user would: a GeoTIFF whose last band is the class raster,
torchgeo's ``RasterDataset`` reading it, a ``RandomGeoSampler`` of ``length`` boxes for
training and a ``GridGeoSampler`` for validation; torchgeo's ``on_after_batch_transfer``
normalises every batch. Ranks take slices 5/3/2 of the first global batch of 10 draws, then
2/3/5 (a plan switch agreed in a callback, as the scheduler sync does). The epoch's draws go
to exactly one rank each, the datamodule's batch hooks ran on every carved batch, and after 3
steps the parameters equal those of the same task trained on one device over the same global
batches of draws. The carved loader is built from the runtime's parts as
``prepare_data_loader`` builds it (that one also reads Ray Train's checkpoint, which needs a
Ray Train worker: tests/integration/test_lightning.py covers the strategy's own replacement).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gloo_group import run_gloo_group

from raytrain_hetero.config import BatchConfig
from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene

SLICES, SWITCHED = (5, 3, 2), (2, 3, 5)
BATCH, LENGTH, STEPS, PATCH = 10, 30, 3, 16
LR, TOLERANCE, GRADIENT_RTOL = 1e-5, 1e-4, 1e-4  # AdamW: see test_lightning_exactness.py


def _write_stacked_scene(root: Path) -> Path:
    """One GeoTIFF: the 9 bands of a generated L7Irish scene plus its class raster (0..4)."""
    import rasterio

    source = generate_hyperspectral_scene(
        root / "l7", height=64, width=64, bands=9, classes=4, file_format="l7irish"
    )
    with rasterio.open(next(source.glob("L71001*.TIF"))) as src:
        image, profile = src.read(), src.profile
    with rasterio.open(next(source.glob("L7_p1_*.TIF"))) as src:
        classes = np.searchsorted([0, 64, 128, 192, 255], src.read(1)).astype(image.dtype)
    out = root / "scene"
    out.mkdir()
    profile.update(count=10)
    with rasterio.open(out / "scene_1.tif", "w", **profile) as dst:
        dst.write(np.concatenate([image, classes[None]]))
    return out


def _datamodule(paths: str):
    """The user's GeoDataModule (importable by the spawned ranks)."""
    from torchgeo.datamodules import GeoDataModule
    from torchgeo.datasets import RasterDataset
    from torchgeo.samplers import GridGeoSampler, RandomGeoSampler

    class StackedScene(RasterDataset):
        filename_glob = "scene_*.tif"

    def split_label(sample: dict) -> dict:
        sample["mask"] = sample["image"][-1].long()
        sample["image"] = sample["image"][:-1]
        return sample

    class SceneDataModule(GeoDataModule):
        mean, std = torch.tensor(1000.0), torch.tensor(3000.0)

        def __init__(self, paths: str) -> None:
            super().__init__(StackedScene, 4, PATCH, LENGTH, paths=paths, transforms=split_label)
            self.hooked = 0

        def setup(self, stage: str) -> None:
            self.train_dataset = self.val_dataset = StackedScene(**self.kwargs)
            self.train_sampler = RandomGeoSampler(self.train_dataset, PATCH, LENGTH)
            self.val_sampler = GridGeoSampler(self.val_dataset, PATCH, PATCH)

        def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
            self.hooked += bool(self.trainer and self.trainer.training)
            return super().on_after_batch_transfer(batch, dataloader_idx)  # normalises

    return SceneDataModule(paths)


def _task():
    from torchgeo.trainers import SemanticSegmentationTask

    torch.manual_seed(0)
    return SemanticSegmentationTask(
        model="fcn", in_channels=9, num_classes=5, num_filters=8, loss="ce", lr=LR
    )


def _callbacks(switch: bool) -> tuple:
    import lightning.pytorch as pl

    class Log(pl.Callback):
        def __init__(self) -> None:
            self.grads: list[list[torch.Tensor]] = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            grads = [p.grad.detach().clone() for p in pl_module.parameters() if p.grad is not None]
            self.grads.append(grads)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if switch and batch_idx == 0:
                import raytrain_hetero as rh

                rh.update_plan(shares=[float(s) for s in SWITCHED], reason="test")

    return (Log(),)


def _trainer(callbacks: tuple, **kwargs):
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
        **kwargs,
    )


def _rank_main(rank: int, world_size: int, paths: str) -> dict:
    from torchgeo.datasets import stack_samples

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.core.carving import Cursor, EpochCarver
    from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
    from raytrain_hetero.worker.lightning import geo_draws
    from raytrain_hetero.worker.measure.probe import default_probe_loss
    from raytrain_hetero.worker.plan.calibration import ProbeInputs
    from raytrain_hetero.worker.runtime import plan_flow
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    setup = HeteroSetup(
        run_id="geo",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
        batch=BatchConfig(global_batch_size=BATCH, fixed_shares=SLICES, seed=7),
    )
    runtime = WorkerRuntime.start(RankIdentity(setup=setup, slot=rank, rank=rank, world_size=3))
    install_runtime(runtime)
    dm = _datamodule(paths)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=7)  # what HeteroDDPStrategy carves
    carver = EpochCarver(len(draws), BATCH, 7, 3)
    runtime.loader = LoaderState(carver, Cursor(0, 0))
    inputs = ProbeInputs(draws, stack_samples, default_probe_loss, True)
    records: list = []
    loader = HeteroDataLoader(
        draws,
        state=runtime.loader,
        schedule=runtime.plans.schedule,
        identity=runtime.identity,
        timing=runtime.timing,
        telemetry=runtime.telemetry,
        ensure_plan=lambda: plan_flow.install_first_plan(runtime, inputs),
        on_step_end=lambda r: (records.append(r), plan_flow.on_step_end(runtime, r)),
        move_to_device=False,
        collate_fn=stack_samples,
    )
    dm.train_dataloader = lambda: loader  # the loader the strategy builds from it
    (log,) = callbacks = _callbacks(switch=True)
    trainer = _trainer(
        callbacks,
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        use_distributed_sampler=False,
    )
    task = _task()
    rhl.fit(rhl.prepare_trainer(trainer), task, datamodule=dm)
    taken = []
    for k in range(STEPS):
        plan = runtime.plans.schedule.plan_for(k)
        lo, hi = carver.rank_positions(k, plan, rank)
        taken.append(carver.permutation(0)[lo:hi].tolist())
    return {
        "state": {k: v.detach().clone() for k, v in task.state_dict().items()},
        "grads": log.grads,
        "slices": [r.slice for r in records],
        "taken": taken,
        "hooked": dm.hooked,
        "permutation": carver.permutation(0).tolist(),
    }


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> str:
    return str(_write_stacked_scene(tmp_path_factory.mktemp("geo")))


def test_user_geodatamodule_on_three_uneven_ranks_matches_one_device(scene):
    from torch.utils.data import DataLoader
    from torchgeo.datasets import stack_samples

    from raytrain_hetero.worker.lightning import geo_draws

    by_rank = run_gloo_group(_rank_main, 3, scene, timeout_s=480)
    for rank, result in by_rank.items():
        assert result["slices"] == [SLICES[rank]] + [SWITCHED[rank]] * (STEPS - 1)
        assert result["hooked"] == STEPS  # the datamodule's hook ran on every training batch
    # Each step's draws went to exactly one rank.
    for k in range(STEPS):
        positions = [p for r in range(3) for p in by_rank[r]["taken"][k]]
        assert sorted(positions) == sorted(by_rank[0]["permutation"][k * BATCH : (k + 1) * BATCH])
    # One device, the same global batches of the same draws (listed again here: fixed by
    # seed and epoch), the same datamodule hooks.
    dm = _datamodule(scene)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=7)
    queries = draws.queries(0)
    order = by_rank[0]["permutation"]
    batches = [[queries[i] for i in order[k * BATCH : (k + 1) * BATCH]] for k in range(STEPS)]
    loader = DataLoader(draws.dataset, batch_sampler=batches, collate_fn=stack_samples)
    dm.train_dataloader = lambda: loader
    (log,) = callbacks = _callbacks(switch=False)
    task = _task()
    _trainer(callbacks, devices=1).fit(task, datamodule=dm)
    reference = task.state_dict()
    for result in by_rank.values():
        for got, want in zip(result["grads"][0], log.grads[0]):
            scale = want.abs().max().item()
            assert (got - want).abs().max().item() <= GRADIENT_RTOL * scale + 1e-9
        for key, want in reference.items():
            assert (result["state"][key] - want).abs().max().item() <= TOLERANCE, key
    moved = _task().state_dict()
    assert any((reference[k] - v).abs().max() > 2 * LR for k, v in moved.items())
