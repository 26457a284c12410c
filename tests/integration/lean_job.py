"""The lean YAML job the CLI-level integration tests start from (one definition)."""

from __future__ import annotations

import copy
from typing import Any

#: Two workers, fixed equal shares (no probe), 16-pixel images, 6 steps an epoch.
LEAN_JOB: dict[str, Any] = {
    "name": "lean",
    "data": {
        "dataset": "eurosat",
        "root": "data/eurosat_lean",
        "generate": {"samples_per_class": 20, "size": 16},
        "cache": True,
    },
    "model": {"name": "small_cnn", "width": 8},
    "train": {"epochs": 2, "global_batch_size": 20, "fixed_shares": [1, 1]},
    "workers": [{"name": "a", "resources": {"CPU": 1}}, {"name": "b", "resources": {"CPU": 1}}],
    "ray": {"num_cpus": 3},
}


def lean_job(**sections: Any) -> dict[str, Any]:
    """:data:`LEAN_JOB` with ``sections`` laid over it (a dict section is merged key by key,
    anything else replaces the key); the shared dict is never changed."""
    job = copy.deepcopy(LEAN_JOB)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key] = {**job[key], **value}
        else:
            job[key] = value
    return job
