"""Train loops run on Ray workers by the tests (importable by reference on the workers)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ledgers import record_checkpoint, record_restore

import raytrain_hetero as rh


def make_regression_data(size: int, features: int, classes: int, dtype: torch.dtype, seed: int = 1):
    """Deterministic classification data plus the sample index of each item."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, features, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, classes, (size,), generator=g)
    idx = torch.arange(size)
    return x, y, idx


def plain_model(features: int, classes: int, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, 16), torch.nn.Tanh(), torch.nn.Linear(16, classes)
    ).to(dtype)


def bn_model(features: int, classes: int, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, classes),
    ).to(dtype)


def flat_params(model: torch.nn.Module) -> np.ndarray:
    module = getattr(model, "module", model)
    tensors = [p.detach().double().flatten() for p in module.parameters()]
    tensors += [b.detach().double().flatten() for n, b in module.named_buffers() if "running" in n]
    return torch.cat(tensors).numpy()


def one_device_steps(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch: int,
    epochs: int,
    lr: float,
    min_step_size: int = 3,
) -> Iterator[np.ndarray]:
    """``model``'s parameters after each step of plain SGD on one device over the global
    batches a run carves (seed 0): the one-device reference of every exactness check.

    Weighted sync makes every group step the one-device step on its global batch, whatever
    the shares (test_exactness).
    """
    from raytrain_hetero.core.carving import EpochCarver

    optim = torch.optim.SGD(model.parameters(), lr=lr)
    carver = EpochCarver(len(x), batch, seed=0, min_step_size=min_step_size)
    for epoch in range(epochs):
        perm = torch.from_numpy(carver.permutation(epoch))
        for k in range(carver.steps_per_epoch):
            lo, hi = carver.step_bounds(k)
            ids = perm[lo:hi]
            loss = F.cross_entropy(model(x[ids]), y[ids])
            optim.zero_grad()
            loss.backward()
            optim.step()
            yield flat_params(model)


def one_device_params(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch: int, epochs: int, lr: float
) -> np.ndarray:
    """Where a fault-free run of these loops ends: the last of :func:`one_device_steps`."""
    steps = list(one_device_steps(model, x, y, batch=batch, epochs=epochs, lr=lr))
    return steps[-1] if steps else flat_params(model)


def trajectory_loop(config: dict) -> None:
    """Train each model of config['models'] on the same carved batches; rank 0 saves params per step.

    ``micro`` is the plain model trained through :func:`raytrain_hetero.micro_batches` (the
    accumulation loop; ``bn_micro`` the BatchNorm model); the sizes of its micro-batches are
    appended to each step's ledger entry. ``replan_at``: after that step, every rank switches
    to ``new_shares`` (:func:`raytrain_hetero.update_plan`, mid-epoch).
    """
    dtype = getattr(torch, config["dtype"])
    x, y, idx = make_regression_data(config["size"], 6, 3, dtype)
    builders = {"plain": plain_model, "bn": bn_model, "micro": plain_model, "bn_micro": bn_model}
    models = {name: rh.prepare_model(builders[name](6, 3, dtype)) for name in config["models"]}
    optims = {n: torch.optim.SGD(m.parameters(), lr=config["lr"]) for n, m in models.items()}
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    info = rh.get_rank_info()
    history = {name: [flat_params(m)] for name, m in models.items()}
    ledger = []
    steps = 0
    for epoch in range(loader.epoch, config["epochs"]):
        for xb, yb, ib in loader:
            ledger.append((epoch, steps, ib.tolist()))
            for name, model in models.items():
                optims[name].zero_grad()
                if name in ("micro", "bn_micro"):  # the accumulation loop of rh.micro_batches
                    parts = []
                    for part in rh.micro_batches((xb, yb)):
                        loss = F.cross_entropy(model(part.data[0]), part.data[1])
                        (loss * part.weight).backward()
                        parts.append(part.size)
                    ledger[-1] = (*ledger[-1], parts)
                else:
                    F.cross_entropy(model(xb), yb).backward()
                optims[name].step()
                history[name].append(flat_params(model))
            if steps == config.get("replan_at"):  # a plan change mid-epoch, on every rank
                rh.update_plan(shares=config["new_shares"], reason="test replan")
            steps += 1
            if steps == config.get("max_steps", -1):
                break
        if steps == config.get("max_steps", -1):
            break
    out = Path(config["out"])
    if info["rank"] == 0:
        np.savez(out / "params.npz", **{n: np.stack(h) for n, h in history.items()})
    (out / f"ledger_rank{info['rank']}.json").write_text(json.dumps(ledger))
    rh.report({"steps": steps})


def restore_model_and_optimizer(model, optim) -> None:
    """Load ``model.pt`` (model + optimizer state) of the checkpoint this group resumes from."""
    import ray

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])


def ledger_loop(config: dict) -> None:
    """Records each rank's sample ids per step; changes plan mid-epoch; fails once after a
    checkpoint (an exception); optionally (``crash_rank_at``) rank 1's process dies once,
    mid-step; records every restore and checkpoint digest (:mod:`ledgers`) and the final
    parameters (rank 0)."""
    x, y, idx = make_regression_data(config["size"], 6, 3, torch.float32)
    model = rh.prepare_model(plain_model(6, 3, torch.float32))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    restore_model_and_optimizer(model, optim)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    info = rh.get_rank_info()
    out = Path(config["out"])
    record_restore(out, info, loader.state.carver.global_step(loader.state.cursor), model)
    attempt = len(list(out.glob(f"ledger_rank{info['rank']}_attempt*.jsonl")))
    ledger_path = out / f"ledger_rank{info['rank']}_attempt{attempt}.jsonl"
    fail_marker = out / "failed_once"
    crash_marker = out / "crashed_once"
    for epoch in range(loader.epoch, config["epochs"]):
        for xb, yb, ib in loader:
            step = rh.current_step_number()
            with ledger_path.open("a") as f:
                entry = {"epoch": epoch, "step": step, "ids": ib.tolist(), "group": info["group"]}
                f.write(json.dumps(entry) + "\n")
            if (
                config.get("crash_rank_at") == step
                and info["rank"] == 1
                and fail_marker.exists()
                and not crash_marker.exists()
            ):
                crash_marker.write_text(str(step))
                os._exit(1)  # a worker process dies mid-step
            loss = F.cross_entropy(model(xb), yb)
            optim.zero_grad()
            loss.backward()
            optim.step()
            if step == config["replan_at"]:
                rh.update_plan(shares=config["new_shares"], reason="test replan")
            if step == config["checkpoint_at"]:
                with tempfile.TemporaryDirectory() as d:
                    torch.save(
                        {"model": model.module.state_dict(), "optim": optim.state_dict()},
                        os.path.join(d, "model.pt"),
                    )
                    if info["rank"] == 0:
                        record_checkpoint(out, info, step + 1, model)
                    rh.report(
                        {"step": step},
                        checkpoint=__import__("ray").train.Checkpoint.from_directory(d),
                    )
                if not fail_marker.exists():
                    __import__("torch.distributed").distributed.barrier()
                    if info["rank"] == 0:
                        fail_marker.write_text("1")
                    raise RuntimeError("injected failure after a mid-epoch checkpoint")
    plan = rh.current_plan()
    (out / f"final_rank{info['rank']}.json").write_text(
        json.dumps({"plan_version": plan.version, "slices": list(plan.slices)})
    )
    if info["rank"] == 0:
        np.save(out / "final_params.npy", flat_params(model))
    rh.report({"done": 1})


def placement_loop(config: dict) -> None:
    """Each worker records where it landed and what it is; a couple of real steps run."""
    import ray

    x, y, idx = make_regression_data(24, 6, 3, torch.float32)
    model = rh.prepare_model(plain_model(6, 3, torch.float32))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    for xb, yb, _ in loader:
        loss = F.cross_entropy(model(xb), yb)
        optim.zero_grad()
        loss.backward()
        optim.step()
    info = rh.get_rank_info()
    labels = ray.get_runtime_context().get_node_labels()
    Path(config["out"], f"rank{info['rank']}.json").write_text(
        json.dumps({**info, "pool": labels.get("pool"), "threads": torch.get_num_threads()})
    )
    rh.report({"done": 1})


def wide_model(features: int, classes: int) -> torch.nn.Module:
    """An MLP with real per-sample work (~1 ms per sample per thread), so speeds are measurable."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, 768),
        torch.nn.ReLU(),
        torch.nn.Linear(768, 768),
        torch.nn.ReLU(),
        torch.nn.Linear(768, classes),
    )


def live_loop(config: dict) -> None:
    """Ledger-recording loop for the live scheduler tests (optional kill of the scheduler)."""
    import ray

    x, y, idx = make_regression_data(config["size"], 64, 3, torch.float32)
    model = rh.prepare_model(wide_model(64, 3))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    restore_model_and_optimizer(model, optim)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    info = rh.get_rank_info()
    out = Path(config["out"])
    # The cursor and the model state this group restored, to be checked against each other.
    resume_step = loader.state.carver.global_step(loader.state.cursor)
    record_restore(out, info, resume_step, model)
    ledger = (out / f"ledger_rank{info['rank']}_{info['group']}.jsonl").open("a")
    crash_marker = out / "crashed_once"
    steps_at_full = 0
    # ``ray_docs_preemption``: Ray Train's documented reaction to a notice instead of the
    # library's (benchmarks/preemption.py): read it every step, checkpoint at the first one.
    saved_on_preemption = False
    # ``stop_after_regrowth``: a group of that world size stops once a bigger group ran before
    # it. Every rank reads the same finished ledgers of the earlier groups: they agree.
    stop_world = config.get("stop_at_world")
    if config.get("stop_after_regrowth") == info["world_size"] and any(
        json.loads(line)["world"] > info["world_size"]
        for path in out.glob("ledger_rank*.jsonl")
        for line in path.read_text().splitlines()
    ):
        stop_world = info["world_size"]
    for epoch in range(loader.epoch, config["epochs"]):
        for xb, yb, ib in loader:
            step = rh.current_step_number()
            ledger.write(
                json.dumps(
                    {
                        "epoch": epoch,
                        "step": step,
                        "ids": ib.tolist(),
                        "world": info["world_size"],
                        "group": info["group"],
                    }
                )
                + "\n"
            )
            ledger.flush()
            if (
                config.get("crash_rank_at") == step
                and info["rank"] == 1
                and not crash_marker.exists()
            ):
                crash_marker.write_text(str(step))
                os._exit(1)  # a worker process dies mid-step
            if config.get("step_sleep_s"):
                time.sleep(config["step_sleep_s"])
            loss = F.cross_entropy(model(xb), yb)
            optim.zero_grad()
            loss.backward()
            optim.step()
            if config.get("kill_scheduler_at") == step and info["rank"] == 0:
                from raytrain_hetero.driver.scheduler import (
                    SCHEDULER_NAMESPACE,
                    scheduler_actor_name,
                )

                actor = ray.get_actor(
                    scheduler_actor_name(config["run_id"]), namespace=SCHEDULER_NAMESPACE
                )
                ray.kill(actor, no_restart=False)  # Ray restarts it (max_restarts=-1)
                (out / "killed_scheduler").write_text(str(step))
            every = config.get("checkpoint_every")
            jit = False
            if config.get("ray_docs_preemption"):
                notice = ray.train.get_preemption_info()  # a collective, every step
                jit = notice is not None and not saved_on_preemption
                saved_on_preemption = saved_on_preemption or jit
            # checkpoint_due: the agreed last step before a preemption (test_preemption.py).
            if jit or rh.checkpoint_due() or (every and (step + 1) % every == 0):
                with tempfile.TemporaryDirectory() as d:
                    torch.save(
                        {"model": model.module.state_dict(), "optim": optim.state_dict()},
                        os.path.join(d, "model.pt"),
                    )
                    ck = None
                    if info["rank"] == 0:
                        record_checkpoint(out, info, step + 1, model)
                        ck = ray.train.Checkpoint.from_directory(d)
                    rh.report({"step": step}, checkpoint=ck)
            if info["world_size"] == stop_world:
                steps_at_full += 1
                if (
                    steps_at_full >= config.get("steps_at_full", 3)
                    and (step + 1) % config["checkpoint_every"] == 0
                ):
                    break
        else:
            continue
        break
    if info["rank"] == 0:
        np.save(out / "final_params.npy", flat_params(model))
    rh.report({"done": 1})


def moving_trajectory_loop(config: dict) -> None:
    """The plain model's SGD over the carved batches for ``config['epochs']`` epochs, with a
    checkpoint (model, optimizer, cursor) at every epoch end and a resume from the latest one:
    a run that continues on other workers in a new fit (``tune.allocation: auto``'s move);
    rank 0 saves the final parameters to ``params.npz``."""
    import ray

    dtype = getattr(torch, config["dtype"])
    x, y, idx = make_regression_data(config["size"], 6, 3, dtype)
    model = rh.prepare_model(plain_model(6, 3, dtype))
    optim = torch.optim.SGD(model.parameters(), lr=config["lr"])
    restore_model_and_optimizer(model, optim)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    rank = rh.get_rank_info()["rank"]
    for epoch in range(loader.epoch, config["epochs"]):
        for xb, yb, _ in loader:
            optim.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optim.step()
        metrics = {"epoch": epoch, "world": rh.get_rank_info()["world_size"]}
        if rank != 0:
            rh.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:
            state = {"model": model.module.state_dict(), "optim": optim.state_dict()}
            torch.save(state, os.path.join(d, "model.pt"))
            rh.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    if rank == 0:
        np.savez(Path(config["out"]) / "params.npz", plain=flat_params(model.module))
