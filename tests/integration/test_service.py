"""The service path on real Ray: a worker's HeteroError reaches the user as its one line, and
checkpoints are kept by score and by age.

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
from raytrain_hetero.errors import DataError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"

pytestmark = pytest.mark.timeout(600)


# ------------------------------------------------------------------------------ one Ray session


def test_worker_data_error_comes_back_as_its_one_line(ray_local, run_config):
    from service_loops import data_error_loop

    from raytrain_hetero.driver._ray_compat import hetero_error_cause

    message = "/data/Forest_7.tif: truncated TIFF. Fix: regenerate or remove it"
    trainer = HeteroTrainer(
        data_error_loop,
        train_loop_config={"rank": 1, "message": message},
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
        batch=BatchConfig(global_batch_size=8, fixed_shares=(1.0, 1.0)),
        run_config=run_config,
    )
    try:
        result = trainer.fit()
        error: BaseException | None = result.error
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises is what the CLI sees
        error = exc
    assert error is not None and not isinstance(error, DataError)  # Ray's wrapper
    cause = hetero_error_cause(error)
    assert isinstance(cause, DataError) and str(cause) == message


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
    # num_to_keep=2 by val_accuracy (0.9 and 0.8) plus the latest, whatever its score.
    assert kept == [1, 3, 4]
    assert int(Path(result.checkpoint.path, "index.txt").read_text()) == 4
