"""Train loops of test_guards.py (importable by reference on the Ray workers)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
import torch.nn.functional as F

import raytrain_hetero as rh


def dropout_bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.3),
        torch.nn.Linear(16, 3),
    )


def _data(size: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)
    )


def guarded_loop(config: dict) -> None:
    """Dropout + BatchNorm model, guarded SGD; a NaN loss on rank 1 at ``nan_at``; a checkpoint
    at ``checkpoint_at``; after step ``hang_at`` rank 1 sleeps ``hang_s`` (first attempt only).

    Rank 0 saves the parameters after every step, per attempt (0: first, 1: resumed).
    """
    out = Path(config["out"])
    model = rh.prepare_model(dropout_bn_model())
    optimizer = rh.prepare_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    )
    checkpoint = ray.train.get_checkpoint()
    attempt = 0 if checkpoint is None else 1
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "model.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rh.get_rank_info()["rank"] == 0:
            (out / "resumed_at").write_text(str(time.time()))
    loader = rh.prepare_data_loader(_data(config["size"]))
    rank = rh.get_rank_info()["rank"]
    for _epoch in range(loader.epoch, config["epochs"]):
        for x, y in loader:
            step = rh.current_step_number()
            loss = F.cross_entropy(model(x), y)
            if rank == 1 and step == config["nan_at"]:
                loss = loss * float("nan")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rh.log_step_metrics(loss=float(loss))
            if step == config["checkpoint_at"]:
                with tempfile.TemporaryDirectory() as directory:
                    ckpt = None
                    if rank == 0:
                        torch.save(
                            {
                                "model": model.module.state_dict(),
                                "optimizer": optimizer.state_dict(),
                            },
                            os.path.join(directory, "model.pt"),
                        )
                        ckpt = ray.train.Checkpoint.from_directory(directory)
                    rh.report({"step": step}, checkpoint=ckpt)
            if rank == 0:
                params = [p.detach().flatten() for p in model.module.parameters()]
                np.save(out / f"params_attempt{attempt}_step{step}.npy", torch.cat(params).numpy())
            hang_marker = out / "hung_once"
            if step == config["hang_at"] and rank == 1 and not hang_marker.exists():
                hang_marker.write_text(str(time.time()))
                time.sleep(config["hang_s"])  # rank 0 waits in the next collective
    rh.report({"done": 1})


def mismatched_data_loop(config: dict) -> None:
    """Rank 1's copy of the dataset lacks one sample."""
    rank = rh.get_rank_info()["rank"]
    rh.prepare_model(torch.nn.Linear(6, 3))
    rh.prepare_data_loader(_data(config["size"] - (1 if rank == 1 else 0)))
    rh.report({"done": 1})
