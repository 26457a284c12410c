"""Settings every test process needs before Ray or torch start."""

from __future__ import annotations

import os

# Must be set before Ray Train starts: reports otherwise block ~2 s each.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
