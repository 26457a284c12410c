"""torchgeo's ClassificationTask and EuroSATDataModule, unmodified, on HeteroTrainer (Lightning).

Generates a small synthetic EuroSAT in torchgeo's real layout (or pass --root to the real
EuroSATallBands directory) and trains torchgeo's task through a Lightning Trainer prepared
with ``raytrain_hetero.lightning`` on three CPU workers of emulated unequal speed: uneven
slices of every global batch, exact count-weighted gradients and BatchNorm statistics::

    python examples/train_torchgeo_lightning.py --epochs 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import ray
import torch
from torchgeo.datamodules import EuroSATDataModule
from torchgeo.trainers import ClassificationTask

import raytrain_hetero as rh
from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.workloads import generate_eurosat


def train_loop(config: dict) -> None:
    rhl = rh.lightning
    torch.manual_seed(0)
    task = ClassificationTask(
        model="resnet18", weights=None, in_channels=13, num_classes=10, lr=1e-3
    )
    # batch_size sizes the validation loader; training batches are carved from global_batch_size.
    datamodule = EuroSATDataModule(root=config["root"], batch_size=64)
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
    parser.add_argument("--root", type=Path, default=Path("data/eurosat_synth"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples-per-class", type=int, default=30)
    args = parser.parse_args()
    if not args.root.exists():
        generate_eurosat(args.root, samples_per_class=args.samples_per_class, size=32)
    ray.init(num_cpus=4, include_dashboard=False)
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"root": str(args.root.resolve()), "epochs": args.epochs},
        # EMULATION: slowdowns 1, 2, 4 imitate three devices of unequal speed.
        workers=[
            WorkerSpec(name="fast"),
            WorkerSpec(name="medium", emulated_slowdown=2.0),
            WorkerSpec(name="slow", emulated_slowdown=4.0),
        ],
        batch=BatchConfig(global_batch_size=32),
    )
    result = trainer.fit()
    print("slices per step:", trainer.plans[-1].slices, "error:", result.error)
    print("validation accuracy:", (result.metrics or {}).get("val_OverallAccuracy"))
    ray.shutdown()


if __name__ == "__main__":
    main()
