"""Shared fixtures: real local Ray clusters, shut down through their handles."""

from __future__ import annotations

import os

# Must be set before Ray Train starts: reports otherwise block ~2 s each.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def worker_runtime_env() -> dict:
    """Lets Ray workers import the loops in tests/train_loops.py by reference."""
    path = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}}


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with room for three 1-CPU workers plus helpers."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # address="local": a fresh instance even if a `ray start` cluster runs on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env=worker_runtime_env())
    yield ray
    ray.shutdown()


@pytest.fixture
def run_config(tmp_path):
    """A RunConfig with a unique name in temporary storage (no accidental resume)."""
    import uuid

    from ray.train import RunConfig

    return RunConfig(name=f"test-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path / "ray_results"))
