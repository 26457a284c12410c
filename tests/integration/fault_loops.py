"""The train loop of the fault-injection suite and the soak script (importable on workers).

A small deterministic classification job that checkpoints every ``checkpoint_every`` steps,
switches plans at the steps in ``replan_at`` (manual ``update_plan``, so a ``plan_switch``
fault has a switch to fire at) and writes the ledgers of :mod:`ledgers`: per-step sample ids,
parameter digests at every checkpoint and at every group start, and the final parameters.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
import torch.nn.functional as F
from ledgers import record_checkpoint, record_restore, record_step
from train_loops import (
    flat_params,
    make_regression_data,
    plain_model,
    restore_model_and_optimizer,
)

import raytrain_hetero as rh


def fault_loop(config: dict) -> None:
    """Train ``epochs`` epochs over ``size`` samples; ledgers and digests under ``out``."""
    x, y, idx = make_regression_data(config["size"], 6, 3, torch.float32)
    model = rh.prepare_model(plain_model(6, 3, torch.float32))
    optim = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.1))
    restore_model_and_optimizer(model, optim)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    info = rh.get_rank_info()
    out = Path(config["out"])
    resume_step = loader.state.carver.global_step(loader.state.cursor)
    record_restore(out, info, resume_step, model)
    every = config.get("checkpoint_every", 2)
    replan_at = config.get("replan_at", {})
    with (out / f"ledger_rank{info['rank']}_{info['group']}.jsonl").open("a") as ledger:
        for epoch in range(loader.epoch, config["epochs"]):
            for xb, yb, ib in loader:
                step = rh.current_step_number()
                record_step(ledger, epoch, step, ib.tolist(), info)
                if config.get("step_sleep_s"):
                    time.sleep(config["step_sleep_s"])
                loss = F.cross_entropy(model(xb), yb)
                optim.zero_grad()
                loss.backward()
                optim.step()
                if str(step) in replan_at:
                    shares = replan_at[str(step)][: info["world_size"]]
                    rh.update_plan(shares=shares, reason=f"test replan at {step}")
                # checkpoint_due: the agreed last step before a preemption (the soak's notices).
                if rh.checkpoint_due() or (step + 1) % every == 0:
                    _checkpoint(model, optim, out, info, step + 1)
    if info["rank"] == 0:
        np.save(out / "final_params.npy", flat_params(model))
    rh.report({"done": 1})


def _checkpoint(model, optim, out: Path, info: dict, resume_step: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if info["rank"] == 0:
            torch.save(
                {"model": model.module.state_dict(), "optim": optim.state_dict()},
                os.path.join(d, "model.pt"),
            )
            record_checkpoint(out, info, resume_step, model)
            checkpoint = ray.train.Checkpoint.from_directory(d)
        rh.report({"resume_step": resume_step}, checkpoint=checkpoint)
