"""SAR + multispectral fusion (as in Aspri et al.): each single branch vs the two-branch model.

Generates co-registered Sentinel-1 / Sentinel-2 patch pairs (a third of the optical patches
under cloud; or pass --root to a So2Sat copy, which needs h5py), then trains the same
two-branch CNN three times with HeteroTrainer on two CPU workers of emulated unequal speed:
SAR branch only, optical branch only, and both with late fusion; prints the test accuracy
of each::

    python examples/train_multimodal_fusion.py        # ~3 min on 2 cores
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
    generate_multimodal,
    multimodal_datasets,
)
from raytrain_hetero.workloads.cache import InMemoryDataset


def make_model(dataset, modalities) -> torch.nn.Module:
    channels = int(dataset[0]["image"].shape[0])
    return build_model(
        "fusion_cnn",
        in_channels=channels,
        num_classes=dataset.num_classes,
        width=16,
        s1_channels=dataset.s1_channels,
        modalities=modalities,
    )


def train_loop(config: dict) -> None:
    data = multimodal_datasets(config["root"], splits=("train",))
    train = InMemoryDataset(data["train"])  # decode every patch pair once per worker
    torch.manual_seed(0)
    model = rh.prepare_model(make_model(data["train"], config["modalities"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = rh.prepare_data_loader(train)
    for epoch in range(loader.epoch, config["epochs"]):
        model.train()
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rh.get_rank_info()["rank"] == 0:
            with tempfile.TemporaryDirectory() as directory:
                torch.save({"model": model.module.state_dict()}, Path(directory) / "model.pt")
                rh.report(
                    {"epoch": epoch}, checkpoint=ray.train.Checkpoint.from_directory(directory)
                )
        else:
            rh.report({"epoch": epoch})


def test_accuracy(checkpoint: ray.train.Checkpoint, root: str, modalities) -> float:
    test = multimodal_datasets(root, splits=("test",))["test"]
    model = make_model(test, modalities)
    with checkpoint.as_directory() as directory:
        model.load_state_dict(torch.load(Path(directory) / "model.pt", weights_only=True)["model"])
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(test, batch_size=256):
            correct += int((model(batch["image"]).argmax(1) == batch["label"]).sum())
    return correct / len(test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data/multimodal_synth"))
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    if not (args.root / "classes.txt").exists() and not (args.root / "training.h5").exists():
        generate_multimodal(args.root, samples_per_class=120, cloud_fraction=0.4)
    root = str(args.root.resolve())
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    rows = []
    for name, modalities in (
        ("SAR only (s1)", ["s1"]),
        ("optical only (s2)", ["s2"]),
        ("late fusion (s1+s2)", ["s1", "s2"]),
    ):
        trainer = HeteroTrainer(
            train_loop,
            train_loop_config={"root": root, "modalities": modalities, "epochs": args.epochs},
            # EMULATION: the slow worker stretches its compute 2x.
            workers=[WorkerSpec(name="fast"), WorkerSpec(name="slow", emulated_slowdown=2.0)],
            batch=BatchConfig(global_batch_size=64),
        )
        result = trainer.fit()
        rows.append((name, test_accuracy(result.checkpoint, root, modalities)))
        print(f"{name:<22} test accuracy {rows[-1][1]:.4f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
