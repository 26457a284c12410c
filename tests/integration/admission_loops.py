"""Train loop of the admission test (importable by reference on the Ray workers)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from train_loops import make_regression_data, wide_model

import raytrain_hetero as rh


def admission_loop(config: dict) -> None:
    """A few real steps; every rank of every group records who it is and what it trained."""
    x, y, idx = make_regression_data(config["size"], 64, 3, torch.float32)
    model = rh.prepare_model(wide_model(64, 3))
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    info = rh.get_rank_info()
    steps = 0
    for _ in range(loader.epoch, config["epochs"]):
        for xb, yb, _ in loader:
            loss = F.cross_entropy(model(xb), yb)
            optim.zero_grad()
            loss.backward()
            optim.step()
            steps += 1
    record = {**info, "steps": steps, "slices": list(rh.current_plan().slices)}
    Path(config["out"], f"{info['group']}_rank{info['rank']}.json").write_text(json.dumps(record))
    rh.report({"steps": steps})
