"""EuroSAT (Sentinel-2) with the Python API: all 13 bands or the RGB subset, HeteroTrainer.

Generates a small synthetic EuroSAT in torchgeo's real layout (or pass --root to the real
EuroSATallBands directory), trains a small CNN on three CPU workers of emulated unequal
speed, and prints validation accuracy per epoch::

    python examples/train_eurosat.py --bands all       # 13 bands
    python examples/train_eurosat.py --bands rgb       # B04, B03, B02
"""

from __future__ import annotations

import argparse
from pathlib import Path

import ray
import torch
import torch.nn.functional as F

import raytrain_hetero as rh
from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.workloads import build_model, eurosat_datasets, generate_eurosat
from raytrain_hetero.workloads.cache import InMemoryDataset


def train_loop(config: dict) -> None:
    datasets = eurosat_datasets(config["root"], bands=config["bands"], splits=("train", "val"))
    train = InMemoryDataset(datasets["train"])
    channels = int(train[0]["image"].shape[0])
    torch.manual_seed(0)
    model = rh.prepare_model(
        build_model("small_cnn", in_channels=channels, num_classes=10, width=16)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loader = rh.prepare_data_loader(train)
    for epoch in range(loader.epoch, config["epochs"]):
        model.train()
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        metrics = {"epoch": epoch}
        if rh.get_rank_info()["rank"] == 0:
            model.eval()
            with torch.no_grad():
                batch = next(
                    iter(
                        torch.utils.data.DataLoader(
                            datasets["val"], batch_size=len(datasets["val"])
                        )
                    )
                )
                metrics["val_accuracy"] = float(
                    (model.module(batch["image"]).argmax(1) == batch["label"]).float().mean()
                )
            print(f"epoch {epoch}: val accuracy {metrics['val_accuracy']:.4f}", flush=True)
        rh.report(metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data/eurosat_synth"))
    parser.add_argument("--bands", default="all", help="all, rgb, or comma-separated band names")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    if not args.root.exists():
        generate_eurosat(args.root, samples_per_class=100)
    bands = args.bands if args.bands in ("all", "rgb") else args.bands.split(",")
    ray.init(num_cpus=4, include_dashboard=False)
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"root": str(args.root.resolve()), "bands": bands, "epochs": args.epochs},
        # EMULATION: slowdowns 1, 2, 4 imitate three devices of unequal speed.
        workers=[
            WorkerSpec(name="fast"),
            WorkerSpec(name="medium", emulated_slowdown=2.0),
            WorkerSpec(name="slow", emulated_slowdown=4.0),
        ],
        batch=BatchConfig(global_batch_size=192),
    )
    result = trainer.fit()
    print("slices per step:", trainer.plans[-1].slices, "error:", result.error)
    ray.shutdown()


if __name__ == "__main__":
    main()
