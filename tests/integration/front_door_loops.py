"""Train loops of tests/integration/test_front_door.py (importable by reference on workers)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from train_loops import make_regression_data, plain_model

import raytrain_hetero as rh


def epoch_report_loop(config: dict) -> None:
    """``config['epochs']`` epochs of the plain model; rank 0 attaches a checkpoint (a file
    naming the epoch) to the reports of the epochs in ``config['checkpoint_epochs']`` only,
    so the last report may carry none (Ray Train V2's ``Result.metrics`` then lags)."""
    import ray

    x, y, idx = make_regression_data(24, 6, 3, torch.float32)
    model = rh.prepare_model(plain_model(6, 3, torch.float32))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y, idx))
    rank = rh.get_rank_info()["rank"]
    for epoch in range(loader.epoch, config["epochs"]):
        for xb, yb, _ in loader:
            optim.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optim.step()
        metrics = {"epoch": epoch, "world": rh.get_rank_info()["world_size"]}
        if rank != 0 or epoch not in config["checkpoint_epochs"]:
            rh.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:
            Path(d, "epoch.txt").write_text(str(epoch))
            rh.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
