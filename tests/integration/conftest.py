"""Real local Ray clusters, shut down through their handles.

Every test in this folder starts real Ray processes and is marked ``ray`` (``-m "not ray"``
runs the fast unit tests only).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_env import worker_runtime_env

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with room for three 1-CPU workers plus helpers."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # address="local": a fresh instance even if a `ray start` cluster runs on this machine.
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=worker_runtime_env(),
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def run_config(tmp_path):
    """A RunConfig with a unique name in temporary storage (no accidental resume)."""
    import uuid

    from ray.train import RunConfig

    return RunConfig(
        name=f"test-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path / "ray_results")
    )
