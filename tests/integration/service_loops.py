"""Train loops of tests/integration/test_service.py (importable by reference on Ray workers)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import ray.train


def scored_checkpoints_loop(config: dict) -> None:
    """Reports one checkpoint per score in ``config["scores"]`` (its index in the file)."""
    for index, score in enumerate(config["scores"]):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "index.txt").write_text(str(index))
            # Ray's own report: this loop tests Ray's checkpoint retention, no carving.
            ray.train.report(
                {"val_accuracy": score, "index": index},
                checkpoint=ray.train.Checkpoint.from_directory(directory),
            )
