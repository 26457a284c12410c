"""Model-parallel training through HeteroTrainer: 2 CPU workers, emulated speeds 1 and 1/2.

One Ray session. The conv-split test chains one run name through three submissions (Ray
Train restores a run by name from its latest checkpoint): conv_split for an epoch, data
parallelism resumed from that checkpoint for an epoch, conv_split resumed from the data
checkpoint for two more epochs, during which the fast worker is killed mid-epoch; the group
restarts from its checkpoint with the fast worker now emulated 8x slower, re-probes and
splits differently. After each submission the full model equals one device trained on the
same carved batches (float64). The branch test trains the S1+S2 fusion model branch-placed.
"""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from conv_split_loops import train_one_device
from model_parallel_loops import LR, MOMENTUM, model_and_data, mp_loop
from ray.train import FailureConfig, RunConfig

from raytrain_hetero import HeteroTrainer, WorkerSpec
from raytrain_hetero.config import BatchConfig
from raytrain_hetero.config.faults import FaultInjectionConfig, FaultSpec
from raytrain_hetero.core.carving import EpochCarver

pytestmark = pytest.mark.ray

SIZE, BATCH = 40, 16  # 3 steps per epoch: 16, 16, 8
STEPS_PER_EPOCH = 3
WORKERS = [WorkerSpec(name="fast"), WorkerSpec(name="slow", emulated_slowdown=2.0)]


def one_device(config: dict, epochs: int) -> dict[str, torch.Tensor]:
    """The single-device model after ``epochs`` epochs of the same carved global batches."""
    model, x, y = model_and_data(config)
    batch = BatchConfig(global_batch_size=BATCH)
    carver = EpochCarver(SIZE, BATCH, seed=batch.seed, min_step_size=len(WORKERS) * batch.min_slice)
    return train_one_device(model, x, y, carver, epochs, lr=LR, momentum=MOMENTUM)


def worst_difference(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(float((got[k].double() - want[k].double()).abs().max()) for k in want)


def fit(config: dict, run_config: RunConfig, **kwargs) -> None:
    trainer = HeteroTrainer(
        mp_loop, train_loop_config=config, workers=WORKERS, run_config=run_config, **kwargs
    )
    result = trainer.fit()
    assert result.error is None, result.error


def starts(out) -> list[dict]:
    return [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]


def test_conv_split_resumes_across_modes_and_resplits_after_a_crash(ray_local, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    config = {"model": "cnn", "size": SIZE, "dtype": "float64", "out": str(out)}
    name, storage = f"mp-{uuid.uuid4().hex[:8]}", str(tmp_path / "ray_results")
    conv_split = {"mode": "conv_split", "layers": ["conv1", "conv2"]}
    # Fixed data shares (the group reads the whole global batch anyway: one replica; the
    # branch test probes them); the kernel split is probed at every worker-group start.
    fixed = {"global_batch_size": BATCH, "fixed_shares": [2.0, 1.0]}
    fit(
        {**config, "mode": "conv_split", "epochs": 1},
        RunConfig(name=name, storage_path=storage),
        batch=fixed,
        parallel=conv_split,
    )
    state = torch.load(out / "latest.pt", weights_only=True)
    assert worst_difference(state["model"], one_device(config, 1)) <= 1e-10
    [first] = starts(out)
    assert first["step"] == 0 and sum(first["kernels"]["conv2"]) == 48
    assert first["layout"][0].startswith("conv1:")
    traffic = json.loads((out / "traffic_rank1.json").read_text())
    assert len(traffic) == STEPS_PER_EPOCH and all(s > 0 and r > 0 for s, r in traffic)

    # Data parallelism resumes the conv-split checkpoint (full model + optimizer state).
    fit(
        {**config, "mode": "data", "epochs": 2},
        RunConfig(name=name, storage_path=storage),
        batch=fixed,
    )
    assert starts(out)[-1]["step"] == STEPS_PER_EPOCH
    state = torch.load(out / "latest.pt", weights_only=True)
    assert worst_difference(state["model"], one_device(config, 2)) <= 1e-10

    # conv_split resumes the data checkpoint; the fast worker dies after step 10, the group
    # restarts from the step-9 checkpoint with "fast" 8x slower (4x slower than "slow").
    crash_step, resume_step = 3 * STEPS_PER_EPOCH + 1, 3 * STEPS_PER_EPOCH
    fit(
        {**config, "mode": "conv_split", "epochs": 4},
        RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=1)),
        batch=fixed,
        parallel=conv_split,
        emulation={"slowdowns": [{"factor": 8.0, "worker": "fast", "from_step": resume_step}]},
        faults=FaultInjectionConfig(
            faults=[FaultSpec(phase="mid_epoch", action="kill", step=crash_step, worker="fast")],
            marker_dir=tmp_path / "faults",
        ),
    )
    before, after = starts(out)[-2:]
    assert before["step"] == 2 * STEPS_PER_EPOCH and after["step"] == resume_step
    fast_before, slow_before = before["kernels"]["conv2"]
    fast_after, slow_after = after["kernels"]["conv2"]
    assert fast_before > slow_before, before  # fast worker at full speed: more kernels
    assert fast_after < slow_after, after  # now the slower one: re-probed into a new split
    state = torch.load(out / "latest.pt", weights_only=True)
    assert worst_difference(state["model"], one_device(config, 4)) <= 1e-10


def test_branch_placement_trains_like_one_device(ray_local, tmp_path):
    config = {
        "model": "fusion", "size": SIZE, "dtype": "float64", "out": str(tmp_path),
        "mode": "branches", "epochs": 2,
    }  # fmt: skip
    fit(
        config,
        RunConfig(name=f"mpb-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path / "ray")),
        batch={"global_batch_size": BATCH},  # probed: the data plan times the plain model
        probe={"calibration_steps": 1},
        parallel={"mode": "branches", "micro_batches": 2},
    )
    [start] = starts(tmp_path)
    assert sorted(name for name, _ in start["branches"]) == ["s1", "s2"]
    assert sum("head" in text for text in start["layout"]) == 1
    for rank in (0, 1):
        traffic = json.loads((tmp_path / f"traffic_rank{rank}.json").read_text())
        assert len(traffic) == 2 * STEPS_PER_EPOCH and all(s > 0 for s, _ in traffic)
    state = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert worst_difference(state["model"], one_device(config, 2)) <= 1e-10
