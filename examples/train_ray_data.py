"""A Ray Data pipeline carved by the plan: GeoTIFFs decoded by Ray Data, trained on uneven workers.

Generates a small synthetic EuroSAT (13-band GeoTIFFs in class folders, torchgeo's layout) or
uses yours (--root), reads the files as bytes with ``ray.data.read_binary_files`` (a local
directory or ``s3://...``), decodes and normalises them in a ``map_batches`` (Ray Data tasks,
scheduled on any node, training or not), and trains on three CPU workers of emulated unequal
speed. Each rank's ``iter_torch_batches`` yields its slice of every global batch; every row
once per epoch (docs/how-to/ray-data.md)::

    python examples/train_ray_data.py                 # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import ray
import torch
import torch.nn.functional as F
from ray.train import RunConfig

import raytrain_hetero as rh
from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.workloads import EUROSAT_CLASSES, build_model, generate_eurosat


def decode(batch: dict) -> dict:
    """map_batches UDF: GeoTIFF bytes -> scaled float32 image; the class from the folder."""
    from rasterio.io import MemoryFile

    images = []
    for data in batch["bytes"]:
        with MemoryFile(bytes(data)) as memfile, memfile.open() as src:
            images.append(src.read().astype(np.float32) / 10000.0)
    labels = [EUROSAT_CLASSES.index(Path(str(p)).parent.name) for p in batch["path"]]
    return {"image": np.stack(images), "label": np.array(labels, dtype=np.int64)}


def train_loop(config: dict) -> None:
    torch.manual_seed(0)
    model = rh.prepare_model(build_model("small_cnn", in_channels=13, num_classes=10, width=16))
    optimizer = rh.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    shard = rh.get_dataset_shard("train")
    for epoch in range(shard.epoch, config["epochs"]):
        correct = seen = 0
        for batch in shard.iter_torch_batches(prefetch_batches=2):
            logits = model(batch["image"])
            loss = F.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rh.log_step_metrics(loss=loss.item())
            correct += int((logits.argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
        rh.report({"epoch": epoch, "train_accuracy_rank": correct / seen})


def main(argv: list[str] | None = None) -> HeteroTrainer:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="EuroSAT root (local or s3://); default: generated")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples-per-class", type=int, default=30)
    parser.add_argument(
        "--storage-path", help="where Ray Train keeps the run (default ~/ray_results)"
    )
    args = parser.parse_args(argv)
    root = args.root or str(
        generate_eurosat("data/eurosat_synth", samples_per_class=args.samples_per_class)
    )
    tifs = f"{root.rstrip('/')}/ds/images/remote_sensing/otherDatasets/sentinel_2/tif"
    if not ray.is_initialized():  # a cluster joined already (Ray Jobs, a test) is kept
        ray.init(num_cpus=4)
    # pipeline: start
    train = (
        ray.data.read_binary_files(tifs, include_paths=True, file_extensions=["tif"])
        .random_shuffle()
        .map_batches(decode, batch_size=32)  # decodes in Ray Data tasks, on any node
    )
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"epochs": args.epochs},
        workers=[
            WorkerSpec(name="fast"),
            WorkerSpec(name="mid", emulated_slowdown=2.0),
            WorkerSpec(name="slow", emulated_slowdown=4.0),
        ],
        batch=BatchConfig(global_batch_size=48),
        datasets={"train": train},
        run_config=RunConfig(storage_path=args.storage_path),
    )
    result = trainer.fit()
    # pipeline: end
    print("plans:", [(p.effective_step, list(p.slices), p.reason) for p in trainer.plans])
    print("final metrics:", result.metrics)
    return trainer


if __name__ == "__main__":
    main()
