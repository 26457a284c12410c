"""Guards inside the worker, on real Ray: the step guard, collective timeouts reaching the
BatchNorm group, a bit-exact resume with Dropout, and ranks that must see the same dataset."""

from __future__ import annotations

import time

import numpy as np
import pytest
from guard_loops import guarded_loop, mismatched_data_loop
from ray.train import FailureConfig, RunConfig

from raytrain_hetero import BackendConfig, BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver._ray_compat import hetero_error_cause
from raytrain_hetero.errors import DataError

TIMEOUT_S = 3
HANG_S = 300
CONFIG = {"size": 64, "epochs": 1, "nan_at": 1, "checkpoint_at": 3, "hang_at": 5}


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
    out = tmp_path / "run"
    out.mkdir()
    trainer = _trainer(
        guarded_loop,
        {**CONFIG, "out": str(out), "hang_s": HANG_S},
        tmp_path,
        "hang",
        failure_config=FailureConfig(max_failures=1),
    )
    started = time.time()
    result = trainer.fit()
    assert result.error is None
    # Rank 1 fell asleep after step 5; rank 0 waited in the BatchNorm statistics all-reduce
    # of step 6, which failed the group after the timeout; Ray Train restarted it from the
    # checkpoint of step 3.
    hung_at = float((out / "hung_once").read_text())
    resumed_at = float((out / "resumed_at").read_text())
    assert resumed_at - hung_at < TIMEOUT_S + 45, resumed_at - hung_at
    assert time.time() - started < HANG_S
    steps = 64 // 8
    assert not (out / "params_attempt0_step6.npy").exists()
    assert (out / f"params_attempt1_step{steps - 1}.npy").exists()  # and finished
    # The resumed attempt restored cursor, model, optimizer and every rank's generators:
    # it re-ran steps 4 and 5 with the same Dropout masks, bit for bit.
    for step in (4, 5):
        first = np.load(out / f"params_attempt0_step{step}.npy")
        again = np.load(out / f"params_attempt1_step{step}.npy")
        np.testing.assert_array_equal(again, first, err_msg=f"step {step}")
    # The NaN step was skipped on every rank (parameters unchanged) and counted.
    before = np.load(out / f"params_attempt0_step{CONFIG['nan_at'] - 1}.npy")
    np.testing.assert_array_equal(
        np.load(out / f"params_attempt0_step{CONFIG['nan_at']}.npy"), before
    )
    skipped = {(r.rank, r.step) for r in trainer.step_records if r.skipped_nonfinite}
    assert skipped == {(0, CONFIG["nan_at"]), (1, CONFIG["nan_at"])}


def test_ranks_with_different_datasets_fail_naming_the_rank(ray_local, tmp_path):
    trainer = _trainer(mismatched_data_loop, {"size": 64}, tmp_path, "mismatch")
    with pytest.raises(Exception) as info:  # Ray's TrainingFailedError wraps the DataError
        result = trainer.fit()
        if result.error is not None:
            raise result.error
    message = str(info.value)
    assert "Ranks see different datasets" in message
    assert "rank 1 on node" in message and "sees 63 samples" in message
    assert "rank(s) [0] see 64 samples" in message
    # What the CLI prints: the worker's DataError itself, unwrapped from Ray's error.
    assert not isinstance(info.value, DataError)
    cause = hetero_error_cause(info.value)
    assert isinstance(cause, DataError) and str(cause).startswith("Ranks see different datasets")
