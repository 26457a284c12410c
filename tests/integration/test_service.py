"""The service path on real Ray: checkpoints are kept by score and by age. (A worker's
HeteroError reaching the user as its one line is asserted on the dataset-mismatch fit of
test_guards.py.)

``kill -9`` of a worker during ``raytrain-hetero train`` and ``--run-name ... --resume`` are
proven on one CLI run in test_storage_s3.py (storage in a bucket); the local refusal of a
second submission without ``--resume`` in test_cli_parallel.py, and the earlier steps a
resumed run keeps in metrics.csv there too."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain_hetero import HeteroTrainer, WorkerSpec
from raytrain_hetero.app.config import load_config
from raytrain_hetero.app.runs import RunIdentity
from raytrain_hetero.config import BatchConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"

pytestmark = pytest.mark.timeout(600)


# ------------------------------------------------------------------------------ one Ray session


def test_best_and_latest_checkpoints_survive(ray_local, tmp_path):
    from service_loops import scored_checkpoints_loop

    from raytrain_hetero.app.job import run_config

    job = load_config(EXAMPLE)
    run = RunIdentity("scored", tmp_path / "store")
    scores = [0.5, 0.9, 0.7, 0.8, 0.2]  # the last one is the worst
    trainer = HeteroTrainer(
        scored_checkpoints_loop,
        train_loop_config={"scores": scores},
        workers=[WorkerSpec(name="solo")],
        batch=BatchConfig(global_batch_size=4, fixed_shares=(1.0,)),
        run_config=run_config(job, run),
    )
    result = trainer.fit()
    assert result.error is None
    kept = sorted(
        int((d / "index.txt").read_text()) for d in run.folder.glob("checkpoint_*") if d.is_dir()
    )
    # num_to_keep=1 by val_accuracy (0.9) plus the latest, whatever its score: two copies.
    assert kept == [1, 4]
    assert int(Path(result.checkpoint.path, "index.txt").read_text()) == 4
