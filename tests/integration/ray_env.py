"""The runtime environment of Ray workers started by the integration tests."""

from __future__ import annotations

import os

INTEGRATION_DIR = os.path.dirname(os.path.abspath(__file__))


def worker_runtime_env() -> dict:
    """Lets Ray workers import the loops in tests/integration/train_loops.py by reference."""
    path = os.pathsep.join(p for p in (INTEGRATION_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}}


#: GCS health checks for the test clusters that lose nodes: a removed node is declared dead
#: after 3 missed 1 s checks (~3 s) rather than Ray's 5 missed 3 s checks (~15 s), so a
#: restart sizes the new group without it sooner. A live raylet answers within the default
#: 10 s timeout even on a loaded machine, so no live node is declared dead.
FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
