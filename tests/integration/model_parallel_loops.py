"""Train loops of test_model_parallel_training.py: one loop for every parallel mode.

The loop trains through the public API only (``prepare_model_parallel`` or ``prepare_model``,
``prepare_optimizer``, ``prepare_data_loader``, ``report``), resumes from the run's latest
checkpoint whatever mode wrote it (the full, unsplit model and optimizer state), checkpoints
at every epoch end, and rank 0 appends what each worker-group start saw (first step, layout)
to ``starts.jsonl``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import ray
import torch
import torch.nn.functional as F
from conv_split_loops import build_model, make_images
from torch.utils.data import TensorDataset

import raytrain_hetero as rh
from raytrain_hetero.workloads.models import TwoBranchFusionCNN

LR = 0.05
MOMENTUM = 0.9


def build_fusion_model(dtype: torch.dtype) -> TwoBranchFusionCNN:
    """The S1+S2 fusion CNN, small; dropout off so the head is deterministic."""
    torch.manual_seed(0)
    model = TwoBranchFusionCNN(s1_channels=2, s2_channels=4, num_classes=4, width=4)
    model.head[2].p = 0.0
    return model.to(dtype)


def make_fusion_data(size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(size, 6, 16, 16, generator=g, dtype=torch.float64).to(dtype)
    return x, torch.randint(0, 4, (size,), generator=g)


def model_and_data(config: dict) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    dtype = getattr(torch, config["dtype"])
    if config["model"] == "fusion":
        return build_fusion_model(dtype), *make_fusion_data(config["size"], dtype)
    return build_model(dtype), *make_images(config["size"], dtype)


def _checkpointed_state() -> dict | None:
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return torch.load(Path(directory) / "model.pt", weights_only=True)


def mp_loop(config: dict) -> None:
    torch.set_num_threads(1)
    model, x, y = model_and_data(config)
    state = _checkpointed_state()
    data_mode = config["mode"] == "data"
    if data_mode:
        model = rh.prepare_model(model)
        params = model.parameters()
    else:
        pm = rh.prepare_model_parallel(model, example_input=x[:4])
        params = pm.parameters()
    optimizer = rh.prepare_optimizer(torch.optim.SGD(params, lr=LR, momentum=MOMENTUM))
    if state is not None:
        if data_mode:
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        else:
            pm.restore(state["model"], optimizer, state["optimizer"])
    loader = rh.prepare_data_loader(TensorDataset(x, y))
    rank = rh.get_rank_info()["rank"]
    out = Path(config["out"])
    if rank == 0:
        start = {
            "step": loader.epoch * loader.steps_per_epoch + (loader.steps_per_epoch - len(loader))
        }
        if not data_mode:
            layout = pm.layout()
            start["layout"] = [r.text for r in layout.ranks]
            start["kernels"] = {name: list(split) for name, split in layout.kernels}
            start["branches"] = [list(b) for b in layout.branch_ranks]
        with (out / "starts.jsonl").open("a") as f:
            f.write(json.dumps(start) + "\n")
    traffic = []
    for epoch in range(loader.epoch, config["epochs"]):
        if config.get("resplit") and not data_mode:
            pm.maybe_resplit(optimizer)
        for xb, yb in loader:
            if data_mode:
                loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                value = loss.item()
            else:
                step = pm.train_step(xb, yb, F.cross_entropy, optimizer)
                traffic.append([step.bytes_sent, step.bytes_received])
                value = step.loss
            rh.log_step_metrics(loss=value)
        if data_mode:
            full = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        else:
            full = {
                "model": pm.full_state_dict(),
                "optimizer": pm.full_optimizer_state_dict(optimizer),
            }
        if rank == 0:
            with tempfile.TemporaryDirectory() as directory:
                torch.save(full, Path(directory) / "model.pt")
                torch.save(full, out / "latest.pt")
                rh.report(
                    {"epoch": epoch}, checkpoint=ray.train.Checkpoint.from_directory(directory)
                )
        else:
            rh.report({"epoch": epoch})
    (out / f"traffic_rank{rank}.json").write_text(json.dumps(traffic))
