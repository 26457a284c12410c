"""Input pipeline vs training speed: is a worker data-bound?

For a job config, this measures on this machine, in one process:

* **loader samples/s**: batches of the training split through ``torch.utils.data.DataLoader``
  exactly as the job builds it (same dataset class, normalisation and collate), for each
  ``--num-workers`` value, with pinned memory and non-blocking copies when the device is
  CUDA; the first batch (worker start-up) is not timed. With ``data.cache: true`` it also
  measures the in-memory cache (decoded once, then served from memory).
* **per-sample fetch**: median time of ``dataset[i]`` -- the per-sample Python path the loader
  workers run (decode + normalise + patch cut) -- and of a batched ``__getitems__`` where the
  dataset has one (hyperspectral patches), to show where per-sample Python overhead goes.
* **training samples/s**: forward + backward + SGD step of the configured model on batches
  already on the device (``--threads`` torch threads, 1 like a 1-CPU worker).

If the loader delivers fewer samples/s than the model consumes, the worker is data-bound:
add DataLoader workers (``data.num_workers``), cache (``data.cache``) or a smaller
``image_size``. Run::

    python -m benchmarks.loader_speed --config examples/configs/uc_merced_local.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def loader_samples_per_s(
    dataset: Any, *, batch_size: int, batches: int, num_workers: int, device: Any, seed: int = 0
) -> float:
    """Samples/s of shuffled batches from a DataLoader (first batch untimed)."""
    import torch
    from torch.utils.data import DataLoader

    pin = device.type == "cuda"
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        pin_memory=pin,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=False,
    )
    iterator = iter(loader)
    first = next(iterator)  # starts the worker processes
    first["image"].to(device, non_blocking=pin)
    done = 0
    started = time.perf_counter()
    for batch in iterator:
        batch["image"].to(device, non_blocking=pin)
        batch["label"].to(device, non_blocking=pin)
        done += 1
        if done == batches:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    if done == 0:
        raise ValueError("the training split holds fewer than two batches: lower --batch-size")
    return done * batch_size / elapsed


def fetch_seconds(dataset: Any, samples: int = 64) -> dict[str, float]:
    """Median seconds of one ``dataset[i]`` and, if available, per sample in ``__getitems__``."""
    import numpy as np

    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(dataset), size=min(samples, len(dataset))).tolist()
    times = []
    for i in picks:
        t0 = time.perf_counter()
        dataset[i]
        times.append(time.perf_counter() - t0)
    out = {"per_sample_getitem_s": statistics.median(times)}
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is not None:
        t0 = time.perf_counter()
        getitems(picks)
        out["per_sample_getitems_s"] = (time.perf_counter() - t0) / len(picks)
    return out


def training_samples_per_s(model: Any, batches: list[Any], device: Any, steps: int) -> float:
    """Samples/s of SGD steps on batches already on ``device`` (one untimed warm-up step)."""
    import torch
    import torch.nn.functional as F

    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: Any) -> None:
        loss = F.cross_entropy(model(batch["image"]), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step(batches[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    samples = 0
    for i in range(steps):
        batch = batches[i % len(batches)]
        step(batch)
        samples += int(batch["label"].shape[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - started)


def run(
    job: Any,
    *,
    batch_size: int,
    batches: int,
    num_workers: list[int],
    device_name: str,
    threads: int,
) -> dict[str, Any]:
    """Measure everything for ``job``; returns the figures (see the module docstring)."""
    import torch

    from raytrain_hetero.app.config import check_data_root
    from raytrain_hetero.app.datasets import (
        generate_configured_dataset,
        model_arguments,
        open_configured_datasets,
    )
    from raytrain_hetero.workloads.cache import InMemoryDataset
    from raytrain_hetero.workloads.models import build_model

    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device_name)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        generate_configured_dataset(job.data)
        check_data_root(job.data)
        workload = open_configured_datasets(job.data, ("train",))
        train = workload.datasets["train"]
        figures: dict[str, Any] = {
            "dataset": job.data.dataset,
            "train_samples": len(train),
            "batch_size": batch_size,
            "sample_shape": list(train[0]["image"].shape),
            "device": str(device),
            "model": job.model.name,
            "threads": threads,
            **fetch_seconds(train),
            "loader": [],
            "configured": {
                "source": "in-memory" if job.data.cache else "files",
                "num_workers": job.data.num_workers,
            },
        }
        if job.data.num_workers not in num_workers:
            num_workers = [*num_workers, job.data.num_workers]
        sources = [("files", train)]
        if job.data.cache:
            sources.append(("in-memory", InMemoryDataset(train)))
        for source, dataset in sources:
            for workers in num_workers:
                rate = loader_samples_per_s(
                    dataset,
                    batch_size=batch_size,
                    batches=batches,
                    num_workers=workers,
                    device=device,
                )
                figures["loader"].append(
                    {"source": source, "num_workers": workers, "samples_per_s": rate}
                )
        torch.manual_seed(0)
        model = build_model(job.model.name, **model_arguments(job.model, workload))
        loader = torch.utils.data.DataLoader(
            train, batch_size=batch_size, shuffle=True, drop_last=True
        )
        on_device = []
        for batch in loader:
            on_device.append({k: v.to(device) for k, v in batch.items()})
            if len(on_device) == 4:
                break
        figures["training_samples_per_s"] = training_samples_per_s(
            model, on_device, device, steps=max(4, batches // 2)
        )
        return figures
    finally:
        torch.set_num_threads(previous_threads)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="job config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="batch size (default: the config's global_batch_size)",
    )
    parser.add_argument("--batches", type=int, default=20, help="timed batches per measurement")
    parser.add_argument(
        "--num-workers",
        type=int,
        nargs="+",
        default=[0, 2],
        help="DataLoader worker counts to compare (default 0 2)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the training step (default 1, like a 1-CPU worker)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    from raytrain_hetero.app.config import load_config, parse_overrides
    from raytrain_hetero.errors import HeteroError

    try:
        job = load_config(args.config, parse_overrides(args.overrides))
        figures = run(
            job,
            batch_size=args.batch_size or job.train.global_batch_size,
            batches=args.batches,
            num_workers=args.num_workers,
            device_name=args.device,
            threads=args.threads,
        )
    except HeteroError as exc:
        print(f"loader_speed: error: {exc}", file=sys.stderr)
        return 2
    print(format_figures(figures))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def format_figures(figures: dict[str, Any]) -> str:
    """Human-readable report with the data-bound verdict."""
    lines = [
        f"{figures['dataset']} train split: {figures['train_samples']} samples, batch "
        f"{figures['batch_size']}, image {tuple(figures['sample_shape'])}, device {figures['device']}",
        f"  per-sample fetch (dataset[i]):          {figures['per_sample_getitem_s'] * 1e3:8.3f} ms",
    ]
    if "per_sample_getitems_s" in figures:
        lines.append(
            f"  per-sample fetch (batched __getitems__): {figures['per_sample_getitems_s'] * 1e3:8.3f} ms"
        )
    for row in figures["loader"]:
        lines.append(
            f"  loader {row['source']:<9} num_workers={row['num_workers']}: "
            f"{row['samples_per_s']:10.1f} samples/s"
        )
    lines.append(
        f"  training step ({figures['model']}, {figures['threads']} thread(s)): "
        f"{figures['training_samples_per_s']:10.1f} samples/s"
    )
    training = figures["training_samples_per_s"]
    configured = next(
        r
        for r in figures["loader"]
        if r["source"] == figures["configured"]["source"]
        and r["num_workers"] == figures["configured"]["num_workers"]
    )
    best = max(figures["loader"], key=lambda r: r["samples_per_s"])
    ratio = configured["samples_per_s"] / training
    where = f"({configured['source']}, num_workers={configured['num_workers']})"
    if ratio < 1.0:
        lines.append(
            f"=> DATA-BOUND as configured {where}: the loader feeds only {ratio:.2f}x what "
            f"training consumes; the best measured loader ({best['source']}, num_workers="
            f"{best['num_workers']}) feeds {best['samples_per_s'] / training:.2f}x. Add "
            "DataLoader workers (data.num_workers), data.cache, or a smaller image_size."
        )
    else:
        lines.append(
            f"=> compute-bound as configured {where}: the loader feeds {ratio:.1f}x what "
            "training consumes"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
