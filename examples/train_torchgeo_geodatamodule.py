"""torchgeo's L7IrishDataModule (a GeoDataModule), unmodified, on HeteroTrainer (Lightning).

The datamodule reads an IntersectionDataset of Landsat 7 scenes and cloud masks (torchgeo's
``L7Irish``), draws ``length`` random boxes per epoch with its ``RandomBatchGeoSampler`` and
validates on ``GridGeoSampler`` cells. ``HeteroDDPStrategy`` lists every epoch's boxes once
(seeded by seed and epoch, the same on every rank) and carves them like sample indices:
each box goes to exactly one worker, in uneven per-step slices by measured speed. The
datamodule's augmentations (``on_after_batch_transfer``) run on every worker's slice.
Generates five scenes in torchgeo's L7Irish layout, or pass --paths to the real data::

    python examples/train_torchgeo_geodatamodule.py --epochs 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import ray
import torch
from torchgeo.datamodules import L7IrishDataModule
from torchgeo.trainers import SemanticSegmentationTask

import raytrain_hetero as rh
from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene


def train_loop(config: dict) -> None:
    rhl = rh.lightning
    torch.manual_seed(0)
    task = SemanticSegmentationTask(
        model="unet",
        backbone="resnet18",
        weights=None,
        in_channels=9,
        num_classes=5,
        ignore_index=0,
        lr=3e-3,
    )
    # `length` boxes per epoch, carved across the workers; batch_size sizes validation only.
    datamodule = L7IrishDataModule(paths=config["paths"], patch_size=32, length=120, batch_size=12)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[rhl.HeteroReportCallback()],
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    rhl.fit(rhl.prepare_trainer(trainer), task, datamodule=datamodule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=Path, default=Path("data/l7irish_synth"))
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    if not args.paths.exists():
        generate_hyperspectral_scene(
            args.paths, height=96, width=96, bands=9, classes=4, file_format="l7irish"
        )
    ray.init(num_cpus=4, include_dashboard=False)
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"paths": str(args.paths.resolve()), "epochs": args.epochs},
        # EMULATION: slowdowns 1, 1.5, 3 imitate three devices of unequal speed.
        workers=[
            WorkerSpec(name="fast"),
            WorkerSpec(name="medium", emulated_slowdown=1.5),
            WorkerSpec(name="slow", emulated_slowdown=3.0),
        ],
        batch=BatchConfig(global_batch_size=12),
    )
    result = trainer.fit()
    print("slices per step:", trainer.plans[-1].slices, "error:", result.error)
    print("validation accuracy:", (result.metrics or {}).get("val_MulticlassAccuracy"))
    ray.shutdown()


if __name__ == "__main__":
    main()
