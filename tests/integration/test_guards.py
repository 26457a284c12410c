"""Guards inside the worker, on real Ray: the step guard, collective timeouts reaching the
BatchNorm group, a bit-exact resume with Dropout, and ranks that must see the same dataset."""

from __future__ import annotations

import time

import numpy as np
import pytest
from guard_loops import guarded_loop, mismatched_data_loop
from ray.train import FailureConfig, RunConfig

from raytrain_hetero import BackendConfig, BatchConfig, HeteroTrainer, WorkerSpec

TIMEOUT_S = 5
HANG_S = 300
CONFIG = {"size": 48, "epochs": 2, "nan_at": 1, "checkpoint_at": 3}


def _trainer(loop, config, tmp_path, name, **kwargs) -> HeteroTrainer:
    return HeteroTrainer(
        loop,
        train_loop_config=config,
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
        batch=BatchConfig(global_batch_size=8, fixed_shares=[1.0, 3.0]),
        backend=BackendConfig(collective_timeout_s=TIMEOUT_S),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "results"), **kwargs),
    )


def test_hung_rank_times_out_and_the_resume_is_bit_exact_with_dropout(ray_local, tmp_path):
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    straight.mkdir()
    faulty.mkdir()
    reference = _trainer(guarded_loop, {**CONFIG, "out": str(straight)}, tmp_path, "straight")
    assert reference.fit().error is None

    trainer = _trainer(
        guarded_loop,
        {**CONFIG, "out": str(faulty), "hang_s": HANG_S},
        tmp_path,
        "faulty",
        failure_config=FailureConfig(max_failures=1),
    )
    started = time.time()
    result = trainer.fit()
    assert result.error is None
    # The hang (rank 1 asleep after the checkpoint) failed the group in about the timeout:
    # rank 0 waited in the BatchNorm statistics all-reduce of the next step.
    hung_at = float((faulty / "hung_once").read_text())
    resumed_at = float((faulty / "resumed_at").read_text())
    assert resumed_at - hung_at < TIMEOUT_S + 45, resumed_at - hung_at
    assert time.time() - started < HANG_S
    # Resumed from the checkpoint (cursor, model, optimizer, every rank's generators):
    # Dropout masks repeat, so the parameters are bit-identical to the uninterrupted run.
    np.testing.assert_array_equal(np.load(faulty / "final.npy"), np.load(straight / "final.npy"))

    # The NaN step was skipped on every rank, in both runs, and counted in the records.
    for run in (reference, trainer):
        skipped = {(r.rank, r.step) for r in run.step_records if r.skipped_nonfinite}
        assert skipped == {(0, CONFIG["nan_at"]), (1, CONFIG["nan_at"])}


def test_ranks_with_different_datasets_fail_naming_the_rank(ray_local, tmp_path):
    trainer = _trainer(mismatched_data_loop, {"size": 48}, tmp_path, "mismatch")
    with pytest.raises(Exception) as info:  # Ray's TrainingFailedError wraps the DataError
        result = trainer.fit()
        if result.error is not None:
            raise result.error
    message = str(info.value)
    assert "Ranks see different datasets" in message
    assert "rank 1 on node" in message and "sees 47 samples" in message
    assert "rank(s) [0] see 48 samples" in message
