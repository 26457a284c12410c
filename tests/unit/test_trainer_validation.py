"""HeteroTrainer refuses bad arguments before starting anything, naming the fix."""

from __future__ import annotations

import pytest

from raytrain_hetero import ConfigError, HeteroTrainer, WorkerSpec


def loop(config):  # never runs: construction fails first
    raise AssertionError


def make(**kwargs):
    args = {"workers": [WorkerSpec(name="a"), WorkerSpec(name="b")], "global_batch_size": 8}
    args.update(kwargs)
    return HeteroTrainer(loop, **args)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"workers": []}, "at least one WorkerSpec"),
        ({"workers": [{"name": "a", "emulated_slowdown": 0.5}]}, "workers[0].emulated_slowdown"),
        ({"workers": [{"name": "a", "colour": "red"}]}, "workers[0].colour"),
        ({"global_batch_size": 1}, "raise it to >= 2"),
        ({"fixed_shares": [1.0]}, "one share per worker"),
        ({"fixed_shares": [1.0, 0.0]}, "must all be > 0"),
        ({"weighting": "mean"}, "'proportional'"),
        ({"min_slice": 0}, "min_slice"),
        ({"min_workers": 5}, "min_workers=5"),
        ({"policy": {"improvement_threshold": 2.0}}, "improvement_threshold"),
        ({"slowdown_schedule": [{"factor": 3, "worker": "zz"}]}, "workers are ['a', 'b']"),
        ({"slowdown_schedule": [{"factor": 0.5, "rank": 0}]}, "factor must be a number >= 1"),
        ({"slowdown_schedule": [{"factor": 2}]}, "exactly one of worker= or rank="),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        make(**kwargs)
    assert fragment in str(info.value)


def test_loop_signature_is_checked():
    with pytest.raises(ConfigError, match="zero arguments or one"):
        HeteroTrainer(lambda a, b: None, workers=[WorkerSpec(name="a")], global_batch_size=4)


def test_counts_expand_to_named_slots_and_common_resources():
    trainer = HeteroTrainer(
        loop,
        workers=[WorkerSpec(name="gpu", resources={"CPU": 2, "GPU": 1}),
                 WorkerSpec(name="cpu", count=2, resources={"CPU": 4})],
        global_batch_size=12,
    )
    assert [s.name for s in trainer.specs] == ["gpu", "cpu-0", "cpu-1"]
    scaling = trainer.scaling_config()
    assert scaling.resources_per_worker == {"CPU": 2}
    assert scaling.num_workers == 3
    assert trainer.torch_backend == "gloo"  # a CPU rank makes the group gloo
    assert trainer.live is True
