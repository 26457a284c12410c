"""The front door (issue 48) on an embedded local Ray that ``fit()`` starts itself: sized for
the workers it declares, a Result carrying the last report, the latest checkpoint kept.

One worker-group start. The cluster pre-checks (typos, labels, too many workers, a wait for
busy resources) run on ``test_placement.py``'s cluster, where no worker group is needed.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
import ray
from front_door_loops import epoch_report_loop
from ray.train import RunConfig
from ray_env import INTEGRATION_DIR

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver._ray_compat import machine_cpu_count

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_embedded_ray_fits_the_declared_workers_result_has_the_last_report(
    tmp_path, monkeypatch, caplog
):
    """Workers declaring one CPU more than this machine has: ``fit()`` starts its embedded
    Ray with that many logical CPUs and says so (a group Ray could never place otherwise);
    the loop's last report carries no checkpoint, yet ``result.metrics`` is that report, and
    of the two checkpoints only the latest is on disk."""
    if ray.is_initialized():
        ray.shutdown()
    # The embedded Ray's workers inherit this process's environment: the loops import.
    path = os.pathsep.join(p for p in (INTEGRATION_DIR, os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    machine = machine_cpu_count()
    trainer = HeteroTrainer(
        epoch_report_loop,
        train_loop_config={"epochs": 3, "checkpoint_epochs": [0, 1]},
        workers=[WorkerSpec(name="big", resources={"CPU": machine}), WorkerSpec(name="small")],
        batch=BatchConfig(global_batch_size=8, fixed_shares=[1.0, 1.0]),
        run_config=RunConfig(name=f"front-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path)),
    )
    caplog.set_level(logging.WARNING, logger="raytrain_hetero.driver.placement_check")
    try:
        result = trainer.fit()
        logical_cpus = ray.cluster_resources().get("CPU")
    finally:
        ray.shutdown()
    assert logical_cpus == machine + 1
    assert f"starting the embedded local Ray with {machine + 1} logical CPUs" in caplog.text
    assert result.error is None
    # Ray Train V2 alone would say epoch 1 (its last report with a checkpoint).
    assert result.metrics["epoch"] == 2 and result.metrics["world"] == 2
    assert Path(result.checkpoint.path, "epoch.txt").read_text() == "1"
    run = tmp_path / trainer.run_config.name
    kept = sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir())
    assert len(kept) == 1, kept  # epoch 0's copy was removed: resume reads the latest only
