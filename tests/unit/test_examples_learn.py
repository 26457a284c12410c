"""An example's default run learns: its one-device replica (the same generated data, model,
SGD settings, global batch and epochs; the distributed run makes the same updates, the
exactness invariant) ends clearly above chance on the validation split.

branches_local.yaml once ended at chance (2 epochs of 168 samples: 6 optimizer steps).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raytrain_hetero.app.datasets import (
    generate_configured_dataset,
    model_arguments,
    open_configured_datasets,
)
from raytrain_hetero.app.loading import load_config
from raytrain_hetero.workloads.models import build_model

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"

#: Example -> validation accuracy its default run must reach (chance: 1 / classes).
LEARNS = {"branches_local.yaml": 0.6}


def _stack(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    items = [dataset[i] for i in range(len(dataset))]
    return torch.stack([x["image"] for x in items]).float(), torch.tensor(
        [int(x["label"]) for x in items]
    )


@pytest.mark.parametrize("example", sorted(LEARNS))
def test_the_default_run_of_an_example_learns(example, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # the example's relative data root is generated here
    job = load_config(CONFIGS / example)
    generate_configured_dataset(job.data)
    data = open_configured_datasets(job.data, ("train", "val"))
    x, y = _stack(data.datasets["train"])
    x_val, y_val = _stack(data.datasets["val"])
    torch.manual_seed(job.train.seed)
    model = build_model(job.model.name, **model_arguments(job.model, data))
    train = job.train
    optimizer = torch.optim.SGD(
        model.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
    )
    order = torch.Generator().manual_seed(train.seed)
    for _ in range(train.epochs):
        model.train()
        for batch in torch.randperm(len(x), generator=order).split(train.global_batch_size):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
    assert accuracy >= LEARNS[example] > 2.0 / data.num_classes, (
        f"{example}: validation accuracy {accuracy:.3f} after {train.epochs} epochs"
    )
