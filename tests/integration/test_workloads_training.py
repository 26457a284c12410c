"""A user-registered dataset trains through HeteroTrainer with two workers on the job's own
loop: the registration reaches the Ray worker processes, slices are carved 2:1, and the
checkpoint names the dataset.

Every built-in workload goes through the same worker path without Ray in
tests/unit/test_workloads_job_path.py (with the data problems that stop a job on the
driver); ``classification_loop`` on Ray workers also runs in every YAML job of the suite.
"""

from __future__ import annotations

from pathlib import Path

import registered_datasets
import torch

from raytrain_hetero import BatchConfig, HeteroTrainer
from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.job import classification_loop, prepare_dataset

TWO_WORKERS = [{"name": "fast", "resources": {"CPU": 1}}, {"name": "slow", "resources": {"CPU": 1}}]


def test_registered_dataset_trains_through_hetero_trainer(
    ray_local, run_config, tmp_path: Path
) -> None:
    kind = registered_datasets.REGISTERED_EUROSAT.name  # registered before the config loads
    root = tmp_path / "data"
    job = JobConfig.model_validate(
        {
            "name": "test-registered",
            "data": {
                "dataset": kind,
                "generate": {"samples_per_class": 5, "size": 16},
                "bands": "rgb",
                "cache": True,
                "root": str(root),
            },
            "model": {"name": "small_cnn", "width": 4},
            "train": {"epochs": 1, "global_batch_size": 24, "lr": 0.05, "fixed_shares": [2, 1]},
            "workers": TWO_WORKERS,
            "output_dir": str(tmp_path / "out"),
        }
    )
    sizes = prepare_dataset(job)  # generates the data in its real format, checks it
    assert sizes["train"] >= 2 * 12
    trainer = HeteroTrainer(
        classification_loop,
        train_loop_config={"job": job.model_dump(mode="json")},
        workers=job.workers,
        batch=BatchConfig(
            global_batch_size=job.train.global_batch_size,
            fixed_shares=job.train.fixed_shares,
        ),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None
    assert 0.0 <= result.metrics["val_accuracy"] <= 1.0
    records = trainer.step_records
    assert {r.rank for r in records} == {0, 1}
    steps = -(-sizes["train"] // 24)
    assert len({r.step for r in records}) == steps
    assert {r.slice for r in records if r.rank == 0} >= {16}  # shares 2:1 of 24
    with result.checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / "model.pt", weights_only=True)
    assert state["meta"]["dataset"] == kind and state["meta"]["in_channels"] == sizes["bands"]
