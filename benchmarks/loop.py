"""The one training loop every benchmark contender runs, and the "alone" speed measurement.

``bench_loop(config)`` runs on every Ray Train worker. Model, data, optimiser, evaluation and
logging are identical for all contenders; only the data-parallel plumbing differs:

* ``mode="stock"``: what a Ray Train user writes today. ``ray.train.torch.prepare_model``
  (DDP with its default gradient averaging, plain per-rank BatchNorm: torch's
  ``SyncBatchNorm`` refuses CPU tensors, so a stock CPU user has none), a ``DataLoader`` with
  batch ``B / world_size`` passed through ``ray.train.torch.prepare_data_loader`` (which adds
  a ``DistributedSampler``), ``sampler.set_epoch(epoch)`` each epoch.
* ``mode="hetero"``: ``raytrain_hetero.prepare_model`` / ``prepare_data_loader`` under
  :class:`~raytrain_hetero.driver.trainer.HeteroTrainer` (carved slices, count-weighted gradients,
  global-batch BatchNorm; probing happens at the first iteration of the loader).

Emulated slowdown applies to both the same way, through the one EMULATION helper
(:class:`raytrain_hetero.worker.measure.emulation.SlowdownEmulator`): a worker with factor k sleeps
(k - 1) times its own compute (thread CPU time on one torch thread) before every collective of
the step. raytrain_hetero does it inside its hooks (:class:`raytrain_hetero.worker.measure.timing.StepTiming`);
for stock, :class:`raytrain_hetero.app.bench_stock.StockEmulation` does it (the one the
user-facing ``raytrain-hetero bench`` uses) with a forward pre-hook on the inner module (start
of the step's compute) and a DDP communication hook that stretches before each all-reduce
(and sleeps a worker's EMULATED link delay, ``emulated_collective_delay_s``, there too).

Every rank appends one JSON line per step to ``<out>/rank<r>_<pid>.jsonl``: step, epoch, world
size, its slice, the wall time the step ended; rank 0 evaluates every ``eval_every`` steps
(and at the end) and logs the evaluation's start, end and accuracy. The driver computes every
figure from these files (:mod:`benchmarks.analysis`), for all contenders alike.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["bench_loop", "measure_alone"]


def _build_model(width: int, bands: int, classes: int, seed: int) -> Any:
    import torch

    from raytrain_hetero.workloads import build_model

    torch.manual_seed(seed)
    return build_model("small_cnn", in_channels=bands, num_classes=classes, width=width)


def _loader_processes(config: dict[str, Any], device: Any) -> dict[str, Any]:
    """DataLoader processes of a CUDA rank (``gpu_loader_workers``; none on CPU ranks)."""
    workers = int(config.get("gpu_loader_workers") or 0) if device.type == "cuda" else 0
    return {"num_workers": workers, "persistent_workers": True} if workers else {}


def bench_loop(config: dict[str, Any]) -> None:
    """Train one contender; see the module docstring. Config keys:

    mode ("stock" | "hetero"), data (BenchData fields), width, lr, momentum, weight_decay,
    seed, global_batch_size, epochs, max_steps (optional), eval_every, out;
    stock only: factors, worker_names, devices, threads and link_delays (per rank, optional),
    schedule (rank injections); join: checkpoint_every, stop_at_world, steps_at_full.
    """
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from benchmarks.data import ArrayDataset, BenchData

    loop_started = time.time()
    mode = config["mode"]
    data = BenchData(**config["data"])
    batch = int(config["global_batch_size"])
    train = ArrayDataset(data.path("train_x"), data.path("train_y"), limit=data.train_limit(batch))
    val = ArrayDataset(data.path("val_x"), data.path("val_y"))
    model = _build_model(int(config["width"]), data.bands, data.num_classes, int(config["seed"]))
    emulation: Any = None
    if mode == "stock":
        context = ray.train.get_context()
        rank, world = context.get_world_rank(), context.get_world_size()
        devices = config.get("devices")
        device = torch.device(devices[rank] if devices else "cpu")
        threads = config.get("threads")
        torch.set_num_threads(int(threads[rank]) if threads else 1)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model = ray.train.torch.prepare_model(model, move_to_device=device)
        from raytrain_hetero.app.bench_stock import StockEmulation
        from raytrain_hetero.config import SlowdownInjection
        from raytrain_hetero.worker.measure.emulation import SlowdownSchedule

        factors = config.get("factors") or [1.0] * world
        names = config.get("worker_names") or []
        links = config.get("link_delays") or []  # EMULATED slow links, as the specs say
        emulation = StockEmulation(
            SlowdownSchedule(
                factors[rank] if rank < len(factors) else 1.0,
                worker=names[rank] if rank < len(names) else str(rank),
                rank=rank,
                planned=[SlowdownInjection(**i) for i in config.get("schedule", ())],
            ),
            device,
            float(links[rank]) if rank < len(links) else 0.0,
        )
        emulation.install(model)
        loader: Any = DataLoader(
            train, batch_size=batch // world, shuffle=True, **_loader_processes(config, device)
        )
        # The GPU rank of a mixed group moves its batches itself (Ray's device is the CPU).
        loader = ray.train.torch.prepare_data_loader(loader, move_to_device=device.type == "cpu")
    else:
        import raytrain_hetero as rh

        info = rh.get_rank_info()
        rank, world = info["rank"], info["world_size"]
        device = rh.get_device()
        # sync_batchnorm=False only for the ablation contender (per-slice statistics: inexact);
        # None follows the run's BatchConfig.batchnorm (hetero-local sets it to local).
        model = rh.prepare_model(model, sync_batchnorm=config.get("sync_batchnorm"))
        loader = rh.prepare_data_loader(
            train, pin_memory=device.type == "cuda", **_loader_processes(config, device)
        )
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=float(config["lr"]),
        momentum=float(config.get("momentum", 0.9)),
        weight_decay=float(config.get("weight_decay", 5e-4)),
    )
    step, start_epoch, skip = 0, 0, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "bench.pt", weights_only=True, map_location="cpu")
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, start_epoch, skip = (
            int(state["step"]),
            int(state["epoch"]),
            int(state["step_in_epoch"]),
        )
    out = Path(config["out"])
    log = (out / f"rank{rank}_{os.getpid()}.jsonl").open("a", buffering=1)
    val_x, val_y = val.arrays()
    eval_every = int(config.get("eval_every", 0))
    total_steps = int(config["epochs"]) * (train.size // batch)
    max_steps = min(int(config.get("max_steps") or total_steps), total_steps)
    checkpoint_every = int(config.get("checkpoint_every", 0))
    steps_at_full = 0
    first = True
    log.write(
        json.dumps(
            {
                "event": "start",
                "rank": rank,
                "world": world,
                "time": loop_started,
                "resumed_at": step if checkpoint is not None else None,
            }
        )
        + "\n"
    )

    def epochs() -> Any:
        if mode == "stock":
            for epoch in range(start_epoch, int(config["epochs"])):
                sampler = getattr(loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
                # Stock resumes mid-epoch by skipping batches: under a new world size the
                # DistributedSampler deals different samples, so this is not exactly-once.
                batches = iter(loader)
                for k, item in enumerate(batches):
                    if epoch == start_epoch and k < skip:
                        continue
                    yield epoch, k, item
        else:
            carver_steps = loader.steps_per_epoch
            for epoch in range(loader.epoch, int(config["epochs"])):
                for item in loader:
                    global_step = rh.current_step_number()
                    yield epoch, global_step - epoch * carver_steps, item

    stop = False
    stream = epochs()
    for epoch, step_in_epoch, item in stream:
        if mode == "hetero":
            step = rh.current_step_number()
        record: dict[str, Any] = {"step": step, "epoch": epoch, "rank": rank, "world": world}
        if first:
            record["first_batch_time"] = time.time()
            first = False
        x, y = item["image"], item["label"]
        if x.device != device:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if emulation is not None:
            emulation.step = step
            record["factor"] = emulation.factor
            names = config.get("worker_names") or []
            record["worker"] = names[rank] if rank < len(names) else str(rank)
        else:
            from raytrain_hetero.worker.runtime.registry import get_runtime

            hetero = get_runtime()  # read-only: this step's emulated factor
            record["factor"] = hetero.timing.slowdown()
            record["worker"] = hetero.identity.spec.name
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        record.update(slice=int(y.shape[0]), loss=float(loss.item()), time=time.time())
        done = step + 1
        last = done >= max_steps
        if _at_stop_world(config, world):
            steps_at_full += 1
            if steps_at_full >= int(config.get("steps_at_full", 3)):
                last = True
        if rank == 0 and (last or (eval_every and done % eval_every == 0)):
            record["eval_start"] = time.time()
            record["val_accuracy"] = arrays_accuracy(
                getattr(model, "module", model), val_x, val_y, device
            )
            record["eval_end"] = time.time()
        log.write(json.dumps(record) + "\n")
        if checkpoint_every and done % checkpoint_every == 0 and not last:
            _save_checkpoint(
                model,
                optimizer,
                done,
                epoch,
                step_in_epoch + 1,
                rank,
                mode,
                steps_per_epoch=train.size // batch,
            )
        step = done
        if last:
            stop = True
            break
    stream.close()
    log.write(
        json.dumps({"event": "end", "rank": rank, "time": time.time(), "stopped": stop}) + "\n"
    )
    log.close()
    if mode == "hetero":
        rh.report({"steps": step})
    else:
        ray.train.report({"steps": step})


def _at_stop_world(config: dict[str, Any], world: int) -> bool:
    """True once the group runs at ``stop_at_world`` (the join scenario's stopping rule)."""
    target = config.get("stop_at_world")
    return target is not None and world >= int(target)


def _save_checkpoint(
    model: Any,
    optimizer: Any,
    step: int,
    epoch: int,
    step_in_epoch: int,
    rank: int,
    mode: str,
    steps_per_epoch: int,
) -> None:
    import ray.train
    import torch

    if step_in_epoch >= steps_per_epoch:
        epoch, step_in_epoch = epoch + 1, 0
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if rank == 0:
            torch.save(
                {
                    "model": getattr(model, "module", model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "step_in_epoch": step_in_epoch,
                },
                Path(directory) / "bench.pt",
            )
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        if mode == "hetero":
            import raytrain_hetero as rh

            rh.report({"step": step}, checkpoint=checkpoint)
        else:
            ray.train.report({"step": step}, checkpoint=checkpoint)


def measure_alone(
    data: dict[str, Any],
    width: int,
    seed: int,
    jobs: Sequence[dict[str, Any]],
    steps: int = 5,
    threads: int = 1,
    device: str = "cpu",
) -> list[float]:
    """Samples/s of one worker computing alone: a full step (load, forward, backward with the
    emulated stretch, optimiser) at each job's ``slice`` and ``factor``, no communication.

    Runs inside a Ray task that holds the worker's resources; jobs run one after another.
    Returns one figure per job: slice / median step seconds over ``steps`` timed steps (one
    untimed step first, and a few untimed steps before the first job: a fresh process runs
    its first steps slowly).
    """
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.utils.data import default_collate

    from benchmarks.data import ArrayDataset, BenchData
    from raytrain_hetero.worker.measure.clock import ComputeClock
    from raytrain_hetero.worker.measure.emulation import SlowdownEmulator

    torch.set_num_threads(max(1, int(threads)))
    dev = torch.device(device)
    bench = BenchData(**data)
    train = ArrayDataset(bench.path("train_x"), bench.path("train_y"))
    rng = np.random.default_rng(seed)
    emulator = SlowdownEmulator(ComputeClock(dev))
    results: list[float] = []
    # A fresh process runs its first steps slowly (lazy kernel set-up): warm it up once.
    warmup = (
        [{"slice": max(int(j["slice"]) for j in jobs), "factor": 1.0, "warmup": True}]
        if jobs
        else []
    )
    for job in [*warmup, *jobs]:
        b, factor = int(job["slice"]), float(job["factor"])
        model = _build_model(width, bench.bands, bench.num_classes, seed).to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        times: list[float] = []
        for k in range(steps + 1):
            started = time.perf_counter()
            indices = rng.integers(0, len(train), size=b)
            item = default_collate([train[int(i)] for i in indices])
            x, y = item["image"].to(dev), item["label"].to(dev)
            emulator.mark()
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            emulator.stretch(factor)
            optimizer.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if k > 0:
                times.append(time.perf_counter() - started)
        if not job.get("warmup"):
            results.append(b / statistics.median(times))
    return results


def arrays_accuracy(
    model: Any, images: Any, labels: Any, device: Any, batch_size: int = 256
) -> float:
    """Top-1 accuracy on arrays (e.g. memory-mapped ``.npy``) of images and labels."""
    import numpy as np
    import torch

    from raytrain_hetero.workloads.evaluation import accuracy

    def batches() -> Iterable[tuple[Any, Any]]:
        for start in range(0, len(labels), batch_size):
            x = np.asarray(images[start : start + batch_size], dtype=np.float32)
            y = np.asarray(labels[start : start + batch_size])
            yield torch.from_numpy(x), torch.from_numpy(y)

    return accuracy(model, batches(), device)
