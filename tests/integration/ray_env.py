"""The runtime environment of Ray workers started by the integration tests."""

from __future__ import annotations

import os

INTEGRATION_DIR = os.path.dirname(os.path.abspath(__file__))


def worker_runtime_env() -> dict:
    """Lets Ray workers import the loops in tests/integration/train_loops.py by reference."""
    path = os.pathsep.join(p for p in (INTEGRATION_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}}
