"""Exactness end to end through HeteroTrainer on real Ray workers and real gloo groups.

The reference is a one-process SGD step on the same global batch, reconstructed from the same
pure carving (the union of the ranks' slices of step t is positions [start, stop) of the
epoch permutation).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from train_loops import (
    bn_model,
    flat_params,
    make_regression_data,
    moving_trajectory_loop,
    one_device_steps,
    plain_model,
    trajectory_loop,
)

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.worker.sync.batchnorm.convert import convert_ghost_batchnorm

pytestmark = pytest.mark.ray

THREE_WORKERS = [WorkerSpec(name="w0"), WorkerSpec(name="w1"), WorkerSpec(name="w2")]


def reference_trajectory(builder, *, size, batch, epochs, lr, dtype, min_step_size, max_steps=None):
    """Parameters before and after each one-device step over the same carved global batches."""
    x, y, _ = make_regression_data(size, 6, 3, dtype)
    model = builder(6, 3, dtype)
    history = [flat_params(model)]
    steps = one_device_steps(
        model, x, y, batch=batch, epochs=epochs, lr=lr, min_step_size=min_step_size
    )
    history.extend(itertools.islice(steps, max_steps))
    return np.stack(history)


def relative_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)


def run_trajectory(tmp_path, run_config, *, workers, shares, weighting="proportional", **config):
    out = tmp_path / f"out-{weighting}-{len(workers)}"
    out.mkdir()
    trainer = HeteroTrainer(
        trajectory_loop,
        train_loop_config={**config, "out": str(out)},
        workers=workers,
        batch=BatchConfig(
            global_batch_size=config["batch"],
            weighting=weighting,
            fixed_shares=shares,
        ),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None
    return np.load(out / "params.npz"), out, trainer


@pytest.fixture(scope="module")
def _fits() -> dict:
    """Fits shared by the tests of this module (each costs a worker-group start)."""
    return {}


@pytest.fixture
def capped_run(ray_local, tmp_path_factory, _fits):
    """One fit, three workers with fixed shares 1:2:5 of B=24 over 101 samples for 2 epochs
    (four full steps and a short fifth of 5 samples per epoch) and caps in samples per pass
    (2, 2, 4) below their slices (3, 6, 15): ``plain`` steps on the whole slice, ``micro``
    accumulates micro-batches, on the same carved batches. The memory probe
    (max_memory_fraction) runs on every real worker and leaves the explicit caps binding (the
    data are tiny). Returns (params, ledgers, trainer)."""
    if "capped" not in _fits:
        from ray.train import RunConfig

        base = tmp_path_factory.mktemp("capped")
        out = base / "out"
        out.mkdir()
        trainer = HeteroTrainer(
            trajectory_loop,
            train_loop_config=dict(
                size=101, batch=24, epochs=2, lr=0.5, dtype="float64",
                models=["plain", "micro"], out=str(out),
            ),
            workers=[WorkerSpec(name=f"w{i}", max_micro_batch=c) for i, c in enumerate((2, 2, 4))],
            batch=BatchConfig(
                global_batch_size=24, fixed_shares=(1.0, 2.0, 5.0), max_memory_fraction=0.5
            ),
            run_config=RunConfig(name="capped", storage_path=str(base / "ray_results")),
        )  # fmt: skip
        assert trainer.fit().error is None
        ledgers = [json.loads((out / f"ledger_rank{r}.json").read_text()) for r in range(3)]
        _fits["capped"] = (np.load(out / "params.npz"), ledgers, trainer)
    return _fits["capped"]


def test_weighted_sync_equals_one_device_step_float64(capped_run):
    params, ledgers, trainer = capped_run
    want = reference_trajectory(
        plain_model, size=101, batch=24, epochs=2, lr=0.5, dtype=torch.float64, min_step_size=3
    )
    got = params["plain"]
    assert got.shape == want.shape == (11, want.shape[1])
    errors = relative_errors(got, want)
    assert errors.max() <= 1e-6, errors
    # The short step really was uneven and every rank got samples in every step.
    sizes = np.array([[len(entry[2]) for entry in ledger] for ledger in ledgers])
    assert sizes.min() >= 1
    assert sizes[:, 4].sum() == 5 and sizes[:, 0].tolist() == [3, 6, 15]
    assert {r.plan_version for r in trainer.step_records} == {1}


def test_memory_capped_micro_batches_equal_one_device_step_float64(capped_run):
    params, ledgers, trainer = capped_run
    want = reference_trajectory(
        plain_model, size=101, batch=24, epochs=2, lr=0.5, dtype=torch.float64, min_step_size=3
    )
    got = params["micro"]
    assert got.shape == want.shape
    assert relative_errors(got, want).max() <= 1e-10
    assert [ledger[0][3] for ledger in ledgers] == [[2, 1], [2, 2, 2], [4, 4, 4, 3]]
    assert all(sum(entry[3]) == len(entry[2]) for ledger in ledgers for entry in ledger)
    assert trainer.plans[0].reason.endswith("samples/pass caps r0:2, r1:2, r2:4")


def test_trajectory_three_uneven_workers_follows_the_one_device_run_float32(
    ray_local, tmp_path, run_config
):
    """30 float32 steps of 3 workers with shares 1:3:6, plain and BatchNorm models, follow
    a plain torch one-device run over the same global batches (BN running stats included)."""
    # 3 epochs of 330 samples at B=32: 11 steps per epoch (tail of 10 is its own step).
    config = dict(
        size=330, batch=32, epochs=3, lr=0.2, dtype="float32", models=["plain", "bn"], max_steps=30
    )
    three, _, _ = run_trajectory(
        tmp_path, run_config, workers=THREE_WORKERS, shares=[1.0, 3.0, 6.0], **config
    )
    for name, builder in (("plain", plain_model), ("bn", bn_model)):
        want = reference_trajectory(
            builder,
            size=330,
            batch=32,
            epochs=3,
            lr=0.2,
            dtype=torch.float32,
            min_step_size=3,
            max_steps=30,
        )
        assert three[name].shape == want.shape == (31, want.shape[1])
        errors = relative_errors(three[name], want)
        assert errors.max() <= 1e-4, (name, errors)
        # The models did move: equality is not trivial.
        assert relative_errors(want[-1:], want[:1])[0] > 1e-2


def test_ghost_batchnorm_three_uneven_workers_equal_one_device_ghost_float64(
    ray_local, tmp_path, run_config
):
    """batchnorm: ghost end to end: 3 workers with shares 1:3:6 planned in whole groups of 4,
    then 3:2:1 from mid-epoch 0 on (update_plan), 30 float64 steps (an 11-group step where an
    epoch's 10-sample tail merged: its last group holds 6), the BatchNorm model whole and in
    memory-capped micro-batches of whole groups, follow one device running ghost BatchNorm
    over the same global batches, running statistics included, within 1e-10."""
    ghost = 4
    out = tmp_path / "out-ghost"
    out.mkdir()
    trainer = HeteroTrainer(
        trajectory_loop,
        train_loop_config=dict(
            size=330, batch=32, epochs=3, lr=0.2, dtype="float64", models=["bn", "bn_micro"],
            max_steps=30, out=str(out), replan_at=3, new_shares=[3.0, 2.0, 1.0],
        ),
        workers=[WorkerSpec(name="w0"), WorkerSpec(name="w1"), WorkerSpec(name="w2", max_micro_batch=9)],
        batch=BatchConfig(
            global_batch_size=32, fixed_shares=(1.0, 3.0, 6.0), batchnorm="ghost", ghost_size=ghost
        ),
        run_config=run_config,
    )  # fmt: skip
    assert trainer.fit().error is None
    params = np.load(out / "params.npz")
    ledgers = [json.loads((out / f"ledger_rank{r}.json").read_text()) for r in range(3)]
    sizes = np.array([[len(entry[2]) for entry in ledger] for ledger in ledgers])
    assert sizes[:, 0].tolist() == [4, 8, 20]  # 1:3:6 of 8 groups, in whole groups
    assert [entry[3] for entry in ledgers[2][:1]] == [[8, 8, 4]]  # caps of 9 -> 2 groups
    # 3:2:1 from the first step no rank had carved (prefetch may have carved a few).
    switched = [k for k in range(30) if sizes[:, k].tolist() == [16, 12, 4]]
    assert switched and 4 <= switched[0] <= 8, sizes[:, :10]
    assert sizes[:, 9].tolist() == [20, 12, 10]  # the merged tail: 42 = 10 groups + 2

    def builder(features, classes, dtype):
        return convert_ghost_batchnorm(bn_model(features, classes, dtype), ghost)

    want = reference_trajectory(
        builder, size=330, batch=32, epochs=3, lr=0.2, dtype=torch.float64, min_step_size=12,
        max_steps=30,
    )  # fmt: skip
    for name in ("bn", "bn_micro"):
        assert params[name].shape == want.shape == (31, want.shape[1])
        assert np.abs(params[name] - want).max() <= 1e-10, name
    assert relative_errors(want[-1:], want[:1])[0] > 1e-2


def test_a_run_moved_twice_to_other_worker_sets_ends_as_the_one_device_run_float64(
    ray_local, tmp_path
):
    """``tune.allocation: auto``'s move, without Tune: one Train run continued in three fits
    (same name, so each resumes the last epoch-end checkpoint) on 1, then 2, then 3 workers
    of unequal shares, its steps carved for 3 (``step_workers``), ends with the parameters of
    the one-device run over the same global batches (float64, 1e-10): the trajectory does not
    depend on the worker sets it moved between."""
    from ray.train import RunConfig

    out = tmp_path / "out"
    out.mkdir()
    run = RunConfig(name="moved", storage_path=str(tmp_path / "ray_results"))
    config = dict(size=101, batch=24, lr=0.5, dtype="float64", out=str(out))
    worlds = []
    for epochs, shares in ((1, (1.0,)), (2, (1.0, 2.0)), (3, (1.0, 3.0, 6.0))):
        trainer = HeteroTrainer(
            moving_trajectory_loop,
            train_loop_config={**config, "epochs": epochs},
            workers=[WorkerSpec(name=f"w{i}") for i in range(len(shares))],
            batch=BatchConfig(global_batch_size=24, fixed_shares=shares, step_workers=3),
            run_config=run,
        )
        result = trainer.fit()
        assert result.error is None, result.error
        assert result.metrics["epoch"] == epochs - 1  # this fit ran one more epoch
        worlds.append(result.metrics["world"])
    assert worlds == [1, 2, 3]
    want = reference_trajectory(
        plain_model, size=101, batch=24, epochs=3, lr=0.5, dtype=torch.float64, min_step_size=3
    )[-1]
    got = np.load(out / "params.npz")["plain"]
    assert relative_errors(got[None], want[None])[0] <= 1e-10
    assert (
        relative_errors(
            want[None],
            reference_trajectory(
                plain_model,
                size=101,
                batch=24,
                epochs=1,
                lr=0.5,
                dtype=torch.float64,
                min_step_size=3,
            )[:1],
        )[0]
        > 1e-2
    )  # the model moved: equality is not trivial
