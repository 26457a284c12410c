"""Conv split in a real HeteroTrainer group: 2 workers with emulated speeds 1 and 1/2.

The split comes from each worker's probed per-kernel cost (the slower worker owns fewer
kernels); every rank reads the whole global batch; when the fast worker slows down 4x (an
injected slowdown) the group re-probes, re-splits live (weights and momentum move between
ranks) and the trained model still equals one device.
"""

from __future__ import annotations

import json

import pytest
import torch
from conv_split_loops import build_model, conv_split_loop, make_images, train_one_device

from raytrain_hetero import HeteroTrainer, WorkerSpec
from raytrain_hetero.core.carving import EpochCarver

pytestmark = pytest.mark.ray

CONFIG = {"size": 40, "batch": 16, "epochs": 2, "dtype": "float64", "min_gain": 0.1}
STEPS_PER_EPOCH = 3  # 40 samples, batch 16: 16, 16, 8


def one_device(config: dict) -> dict[str, torch.Tensor]:
    dtype = getattr(torch, config["dtype"])
    x, y = make_images(config["size"], dtype)
    carver = EpochCarver(config["size"], config["batch"], seed=0, min_step_size=1)
    return train_one_device(
        build_model(dtype), x, y, carver, config["epochs"], lr=0.1, momentum=0.9
    )


def test_conv_split_group_trains_like_one_device(ray_local, tmp_path, run_config):
    trainer = HeteroTrainer(
        conv_split_loop,
        train_loop_config={**CONFIG, "out": str(tmp_path)},
        workers=[WorkerSpec(name="fast"), WorkerSpec(name="slow", emulated_slowdown=2.0)],
        batch={"global_batch_size": CONFIG["batch"]},
        # From the second epoch "fast" is 4x slower than its hardware: half the speed of "slow".
        emulation={"slowdowns": [{"factor": 4.0, "worker": "fast", "from_step": STEPS_PER_EPOCH}]},
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None
    summary = json.loads((tmp_path / "summary.json").read_text())
    # Emulated 2x slower: the probe sees it (the whole conv2 layer's fitted time; a slope fitted
    # from two kernel counts on a loaded 2-core box is noisier), and the slow rank owns fewer
    # kernels. Only the direction is asserted: each rank's own compute time varies with what
    # shares its core (CI once measured 1.23x for the 2x emulation); the unit test
    # test_parallel_conv_split checks the probe's stretch with 1x/4x/9x margins.
    fast_s, slow_s = summary["full_layer_s"]["conv2"]
    assert slow_s > fast_s, summary
    fast, slow = summary["splits"]["conv2"]
    assert fast + slow == 48 and fast > slow >= 1, summary["splits"]
    # Live re-split at the second epoch: the kernels of conv2 move to the now faster rank,
    # and the trajectory below is still the one-device trajectory.
    [event] = summary["resplits"]
    assert event["step"] == STEPS_PER_EPOCH
    new_fast, new_slow = event["conv2"]
    assert new_fast + new_slow == 48 and new_slow > new_fast >= 1, event
    # Replicated layers stayed bitwise identical on both ranks after every step.
    assert summary["spreads"] and max(summary["spreads"]) == 0.0
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    want = one_device(CONFIG)
    assert got.keys() == want.keys()
    worst = max(float((got[k].double() - want[k].double()).abs().max()) for k in want)
    assert worst <= 1e-10, worst
