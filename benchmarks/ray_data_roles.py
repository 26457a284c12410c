"""Node roles, side by side: a CPU node training vs feeding loader-bound trainers vs stock.

EMULATED heterogeneity in one ``ray.cluster_utils.Cluster`` on this machine: a head node
(1 CPU: Ray Data's decode tasks, the driver), two "fast" trainer nodes (1 CPU each, labels
``pool: fast-a``/``fast-b``, no slowdown) and one "CPU node" (1 CPU, label
``pool: cpu-node``) whose training compute is stretched ``--slowdown`` x by the project's one
emulator. All logical nodes share this machine's cores, so the figures measure the mechanism,
not a real GPU cluster. The data: GeoTIFFs (13 bands, DEFLATE) read as bytes by Ray Data and
decoded + augmented (flips, rotations, per-band normalisation, band indices) in
``map_batches``: expensive next to the small CNN, so the fast trainers are loader-bound.

Contenders (one fit each, after one uncounted warm-up of the same Ray session):

* **stock**: Ray Train's ``TorchTrainer`` with its stock ``DataConfig``
  (``streaming_split(equal=True)``) on the two fast nodes (``ScalingConfig`` has one
  ``resources_per_worker`` for all workers, so the CPU node cannot join as another kind of
  worker); the CPU node idles.
* **cpu trains**: ``HeteroTrainer`` with the fast nodes and the CPU node training, slices by
  measured speed (live scheduler).
* **cpu feeds**: ``HeteroTrainer`` with the fast nodes only; the CPU node's CPU is free, so
  Ray Data runs decode tasks there.

After the fits, :func:`raytrain_hetero.driver.roles.node_roles` measures the pipeline's
delivery with all three workers' resources held and with each candidate's released (the
gain is what it adds by feeding), and takes the trainers' compute-bound speeds from the
"cpu trains" fit's step records (compute seconds per sample); it prints the decision beside
the measured figures. Run::

    RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 python -m benchmarks.ray_data_roles
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

BANDS, SIDE, CLASSES = 13, 96, 4


def write_tiles(root: Path, count: int) -> Path:
    """``count`` 13-band uint16 DEFLATE GeoTIFFs ``tile_<id>.tif`` (class = id % 4)."""
    import rasterio
    from rasterio.transform import from_origin

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        spectrum = 300 + 200 * np.roll(np.arange(BANDS), i % CLASSES)
        pixels = spectrum[:, None, None] + rng.integers(0, 400, (BANDS, SIDE, SIDE))
        profile = {
            "driver": "GTiff",
            "height": SIDE,
            "width": SIDE,
            "count": BANDS,
            "dtype": "uint16",
            "compress": "deflate",
            "crs": "EPSG:32632",
            "transform": from_origin(5e5 + 960 * i, 46e5, 10, 10),
        }
        with rasterio.open(root / f"tile_{i}.tif", "w", **profile) as dst:
            dst.write(pixels.astype(np.uint16))
    return root


def decode_augment(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """``map_batches`` UDF: GeoTIFF bytes -> augmented float32 image (+ 3 indices), label."""
    from rasterio.io import MemoryFile

    images, labels = [], []
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        with MemoryFile(bytes(data)) as memfile, memfile.open() as src:
            x = src.read().astype(np.float32)
        i = int(re.search(r"tile_(\d+)\.tif", str(path)).group(1))
        rng = np.random.default_rng(i)
        x = np.rot90(x, k=int(rng.integers(4)), axes=(1, 2))
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        x = (x - x.mean(axis=(1, 2), keepdims=True)) / (x.std(axis=(1, 2), keepdims=True) + 1e-6)
        # Normalised differences of band pairs (NDVI-like), as remote-sensing pipelines add.
        ratios = [
            (x[a] - x[b]) / (np.abs(x[a]) + np.abs(x[b]) + 1e-3)
            for a, b in ((7, 3), (2, 7), (10, 7))
        ]
        images.append(np.concatenate([x, np.stack(ratios)]).astype(np.float32))
        labels.append(i % CLASSES)
    return {"image": np.stack(images), "label": np.array(labels, dtype=np.int64)}


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(BANDS + 3, 8, 3, stride=4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, CLASSES),
    )


def hetero_loop(config: dict[str, Any]) -> None:
    """``HeteroTrainer`` loop: the carved shard, its slices of every global batch."""
    import torch
    import torch.nn.functional as F

    import raytrain_hetero as rh

    model = rh.prepare_model(_model())
    optim = rh.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    shard = rh.get_dataset_shard("train")
    for _ in range(shard.epoch, config["epochs"]):
        for batch in shard.iter_torch_batches(dtypes={"image": torch.float32}):
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optim.zero_grad()
            loss.backward()
            optim.step()
    rh.report({"done": 1})


def stock_loop(config: dict[str, Any]) -> None:
    """Stock Ray Train loop: ``get_dataset_shard`` + ``iter_torch_batches(B / N)``, DDP."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F

    model = ray.train.torch.prepare_model(_model())
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = ray.train.get_dataset_shard("train")
    per_rank = config["batch"] // ray.train.get_context().get_world_size()
    step, samples, since = 0, 0, None
    for _ in range(config["epochs"]):
        dtypes = {"image": torch.float32, "label": torch.int64}
        for batch in shard.iter_torch_batches(batch_size=per_rank, dtypes=dtypes):
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
            if step == config["skip"]:
                since = time.perf_counter()
            elif since is not None:
                samples += config["batch"]  # every rank trains B / N of each global step
    if ray.train.get_context().get_world_rank() == 0:
        steady = samples / (time.perf_counter() - since) if since else float("nan")
        Path(config["out"]).write_text(json.dumps({"steady": steady}))
    ray.train.report({"done": 1})


def _pipeline(tiles: Path) -> Any:
    import ray.data

    return ray.data.read_binary_files(str(tiles), include_paths=True).map_batches(
        decode_augment, batch_size=16
    )


def _fit(kind: str, tiles: Path, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    """One contender's fit; samples/s over the fit's training wall time (start-up excluded)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_hetero import BatchConfig, HeteroTrainer, SchedulerConfig, WorkerSpec

    rows = len(list(tiles.glob("*.tif")))
    run = RunConfig(name=f"roles-{kind}-{uuid.uuid4().hex[:6]}", storage_path=storage)
    started = time.perf_counter()
    if kind == "stock":
        trainer = TorchTrainer(
            stock_loop,
            train_loop_config={
                "epochs": args.epochs,
                "batch": args.batch,
                "skip": args.skip,
                "out": str(Path(storage) / "stock.json"),
            },
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "fast": 1}),
            datasets={"train": _pipeline(tiles)},
            run_config=run,
        )
        result = trainer.fit()
        assert result.error is None, result.error
        wall = time.perf_counter() - started
        steady = json.loads((Path(storage) / "stock.json").read_text())["steady"]
        # Stock drops the rows beyond an equal split; count what it trained on.
        return {"kind": kind, "wall_s": wall, "steady": steady, "rows": rows // 2 * 2 * args.epochs}
    workers = [
        WorkerSpec(name="fast-a", label_selector={"pool": "fast-a"}),
        WorkerSpec(name="fast-b", label_selector={"pool": "fast-b"}),
    ]
    if kind == "cpu trains":
        workers.append(cpu_spec(args))
    trainer = HeteroTrainer(
        hetero_loop,
        train_loop_config={"epochs": args.epochs},
        workers=workers,
        batch=BatchConfig(global_batch_size=args.batch),
        scheduler=SchedulerConfig(live=True, plan_sync_every=2),
        datasets={"train": _pipeline(tiles)},
        run_config=run,
    )
    result = trainer.fit()
    assert result.error is None, result.error
    wall = time.perf_counter() - started
    records = trainer.step_records
    steps = sorted({r.step for r in records})
    return {
        "kind": kind,
        "wall_s": wall,
        "rows": rows * args.epochs,
        "records": records,
        "steps": len(steps),
        # Data wait per step of the fast trainers (StepRecord.load_s over the step's wall).
        "fast_wait_share": statistics.median(
            r.load_s / r.wall_s for r in records if r.worker.startswith("fast") and r.wall_s > 0
        ),
    }


def cpu_spec(args: argparse.Namespace) -> Any:
    from raytrain_hetero import WorkerSpec

    return WorkerSpec(
        name="cpu-node",
        label_selector={"pool": "cpu-node"},
        device="cpu",
        emulated_slowdown=args.slowdown,
    )


def _steady(fit: dict[str, Any], skip: int) -> float:
    """Samples/s over the steps after the first ``skip`` (start-up and first plan excluded)."""
    by_step: dict[int, list[Any]] = {}
    for r in fit["records"]:
        by_step.setdefault(r.step, []).append(r)
    kept = [by_step[s] for s in sorted(by_step)[skip:]]
    samples = sum(r.slice for step in kept for r in step)
    seconds = sum(max(r.wall_s for r in step) for step in kept)
    return samples / seconds if seconds > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=384)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--slowdown", type=float, default=8.0)
    parser.add_argument("--skip", type=int, default=4, help="first steps not counted")
    parser.add_argument("--output", type=Path, default=None, help="write results.json here")
    args = parser.parse_args(argv)

    import ray
    from ray.cluster_utils import Cluster

    from raytrain_hetero.core.allocation import CostModel
    from raytrain_hetero.driver.roles import node_roles

    work = Path(tempfile.mkdtemp(prefix="roles-bench-"))
    tiles = write_tiles(work / "tiles", args.tiles)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1, resources={"fast": 1}, labels={"pool": "fast-a"})
    cluster.add_node(num_cpus=1, resources={"fast": 1}, labels={"pool": "fast-b"})
    cluster.add_node(num_cpus=1, labels={"pool": "cpu-node"})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        storage = str(work / "results")
        _fit("cpu feeds", tiles, args, storage)  # warm-up (a session's first fit runs slow)
        fits = {k: _fit(k, tiles, args, storage) for k in ("stock", "cpu trains", "cpu feeds")}
        # The decision from measured numbers: compute-bound speeds from the training fit.
        trains = fits["cpu trains"]
        names = ["fast-a", "fast-b", "cpu-node"]
        costs = [
            CostModel(
                alpha=0.0,
                beta=statistics.median(
                    r.compute_s / r.slice for r in trains["records"] if r.worker == n and r.slice
                ),
            )
            for n in names
        ]
        from raytrain_hetero import WorkerSpec

        specs = [
            WorkerSpec(name="fast-a", label_selector={"pool": "fast-a"}),
            WorkerSpec(name="fast-b", label_selector={"pool": "fast-b"}),
            cpu_spec(args),
        ]
        decision = node_roles(
            specs,
            costs,
            args.batch,
            dataset=_pipeline(tiles),
            delivery_rows=min(args.tiles, 4 * args.batch),
            candidates=[False, False, True],  # the fast nodes stand for GPU trainers
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"EMULATED: 4 logical nodes on this machine; CPU node compute x{args.slowdown:g}")
    print(
        f"{'contender':<11} {'steady samples/s':>16} {'fit wall s':>10} {'rows/wall':>9} "
        f"{'fast data-wait':>14}"
    )
    results: dict[str, Any] = {
        "decision": decision.to_dict(),
        "args": {**vars(args), "output": None},
    }
    for kind, fit in fits.items():
        steady = fit["steady"] if kind == "stock" else _steady(fit, args.skip)
        wait = f"{fit['fast_wait_share']:.0%}" if "fast_wait_share" in fit else "-"
        overall = fit["rows"] / fit["wall_s"]
        print(f"{kind:<11} {steady:>16.1f} {fit['wall_s']:>10.1f} {overall:>9.1f} {wait:>14}")
        results[kind] = {
            "steady_samples_per_s": steady,
            "wall_s": fit["wall_s"],
            "rows_per_wall_s": overall,
            "fast_wait_share": fit.get("fast_wait_share"),
        }
    print(f"(steady: after the first {args.skip} steps; fit wall: start-up included)")
    print(decision.summary())
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
