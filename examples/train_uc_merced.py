"""UC Merced (aerial RGB, 21 classes) with the Python API: HeteroTrainer + a hand-written loop.

Generates a small synthetic UC Merced in torchgeo's real layout (or uses yours: pass
--root to a directory with UCMerced_LandUse/Images and the uc_merced-*.txt split files),
trains a small CNN (or --model resnet18 / resnet50) on two CPU workers of emulated unequal
speed, and evaluates the final checkpoint on the test split::

    python examples/train_uc_merced.py                 # ~2 min on 2 cores
    python examples/train_uc_merced.py --root /data/ucmerced --model resnet18 --epochs 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import ray
import ray.train
import torch
import torch.nn.functional as F

import raytrain_hetero as rh
from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.workloads import (
    build_model,
    generate_uc_merced,
    uc_merced_datasets,
)


def train_loop(config: dict) -> None:
    """Runs on every worker: its slice of every global batch, count-weighted gradient sync."""
    datasets = uc_merced_datasets(
        config["root"], splits=("train", "val"), image_size=config["image_size"]
    )
    torch.manual_seed(0)
    model = rh.prepare_model(build_model(config["model"], in_channels=3, num_classes=21, width=16))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config["lr"], momentum=0.9, weight_decay=5e-4
    )
    loader = rh.prepare_data_loader(datasets["train"])
    for epoch in range(loader.epoch, config["epochs"]):
        model.train()
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rh.log_step_metrics(loss=loss.item())
        if rh.get_rank_info()["rank"] == 0:
            accuracy = accuracy_of(model.module, datasets["val"])
            with tempfile.TemporaryDirectory() as directory:
                torch.save({"model": model.module.state_dict()}, Path(directory) / "model.pt")
                rh.report(
                    {"epoch": epoch, "val_accuracy": accuracy},
                    checkpoint=ray.train.Checkpoint.from_directory(directory),
                )
        else:
            rh.report({"epoch": epoch})


def accuracy_of(model: torch.nn.Module, dataset) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(dataset, batch_size=128):
            correct += int((model(batch["image"]).argmax(1) == batch["label"]).sum())
            total += len(batch["label"])
    model.train()
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data/uc_merced_synth"))
    parser.add_argument(
        "--model", default="small_cnn", choices=["small_cnn", "resnet18", "resnet50"]
    )
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    if not (args.root / "UCMerced_LandUse").exists():
        generate_uc_merced(args.root, samples_per_class=30, size=128)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={
            "root": str(args.root.resolve()),
            "model": args.model,
            "lr": 0.05,
            "epochs": args.epochs,
            "image_size": args.image_size,
        },
        # EMULATION: the slow worker stretches its compute 3x (use real devices in practice).
        workers=[WorkerSpec(name="fast"), WorkerSpec(name="slow", emulated_slowdown=3.0)],
        batch=BatchConfig(global_batch_size=96),
    )
    result = trainer.fit()
    print("final validation accuracy:", result.metrics["val_accuracy"])
    with result.checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / "model.pt", weights_only=True)
    model = build_model(args.model, in_channels=3, num_classes=21, width=16)
    model.load_state_dict(state["model"])
    test = uc_merced_datasets(args.root, splits=("test",), image_size=args.image_size)["test"]
    print(f"test accuracy: {accuracy_of(model, test):.4f}  (plans: {trainer.plans[-1].slices})")
    ray.shutdown()


if __name__ == "__main__":
    main()
