"""HeteroTrainer refuses bad arguments before starting anything, naming the fix."""

from __future__ import annotations

import pytest

from raytrain_hetero import ConfigError, HeteroTrainer, WorkerSpec
from raytrain_hetero.config import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    PolicyConfig,
    SchedulerConfig,
    SlowdownInjection,
)


def loop(config):  # never runs: construction fails first
    raise AssertionError


TWO = [WorkerSpec(name="a"), WorkerSpec(name="b")]


def make(**kwargs):
    args = {"workers": TWO, "batch": BatchConfig(global_batch_size=8)}
    args.update(kwargs)
    return HeteroTrainer(loop, **args)


def slowdown(**fields):
    return EmulationConfig(slowdowns=(fields,))


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: make(workers=[]), "give at least one WorkerSpec"),
        (
            lambda: make(workers=[{"name": "a", "emulated_slowdown": 0.5}]),
            "workers[0].emulated_slowdown: must be >= 1.0",
        ),
        (lambda: make(workers=[{"name": "a", "colour": "red"}]), "workers[0].colour"),
        (lambda: make(batch=BatchConfig(global_batch_size=1)), "set global_batch_size >= 2"),
        (
            lambda: make(batch=BatchConfig(global_batch_size=8, fixed_shares=[1.0])),
            "one per worker in this order: a, b",
        ),
        (
            lambda: make(batch=BatchConfig(global_batch_size=8, fixed_shares=[1.0, 0.0])),
            "fixed_shares[1]: must be > 0",
        ),
        (
            lambda: make(batch=BatchConfig(global_batch_size=8, weighting="mean")),
            "use one of 'proportional' or 'uniform'",
        ),
        (
            lambda: make(batch=BatchConfig(global_batch_size=8, min_slice=0)),
            "min_slice: must be >= 1",
        ),
        (lambda: make(batch={"global_batch_size": 8, "min_slices": 2}), "rename it to 'min_slice'"),
        (
            lambda: make(elastic=ElasticConfig(min_workers=5)),
            "elastic.min_workers: 5 is more than the 2 worker slots",
        ),
        (
            lambda: make(scheduler=SchedulerConfig(policy={"improvement_threshold": 2.0})),
            "improvement_threshold",
        ),
        (lambda: make(emulation=slowdown(factor=3, worker="zz")), "but the workers are ['a', 'b']"),
        (lambda: make(emulation=slowdown(factor=3, rank=2)), "rank 2 is outside 0..1"),
        (lambda: make(emulation=slowdown(factor=0.5, rank=0)), "factor: must be >= 1.0"),
        (lambda: make(emulation=slowdown(factor=2)), "names neither or both of worker and rank"),
        (
            lambda: make(backend=BackendConfig(torch_backend="mpi")),
            "must be one of 'gloo' or 'nccl'",
        ),
        (
            lambda: make(backend=BackendConfig(collective_timeout_s=0)),
            "collective_timeout_s: must be >= 1",
        ),
        (lambda: make(batch=None), "pass batch=BatchConfig(global_batch_size=...)"),
        (lambda: make(batch=8), "expected a BatchConfig"),
    ],
)
def test_bad_arguments_name_the_problem(build, fragment):
    with pytest.raises(ConfigError) as info:
        build()
    assert fragment in str(info.value)
    assert "Fix:" in str(info.value)


def test_loop_signature_is_checked():
    with pytest.raises(ConfigError, match="zero arguments or one"):
        HeteroTrainer(
            lambda a, b: None,
            workers=[WorkerSpec(name="a")],
            batch=BatchConfig(global_batch_size=4),
        )


def test_counts_expand_to_named_slots_and_common_resources():
    trainer = HeteroTrainer(
        loop,
        workers=[
            WorkerSpec(name="gpu", resources={"CPU": 2, "GPU": 1}),
            WorkerSpec(name="cpu", count=2, resources={"CPU": 4}),
        ],
        batch=BatchConfig(global_batch_size=12),
    )
    assert [s.name for s in trainer.specs] == ["gpu", "cpu-0", "cpu-1"]
    scaling = trainer.scaling_config()
    assert scaling.resources_per_worker == {"CPU": 2}
    assert scaling.num_workers == 3
    assert trainer.torch_backend == "gloo"  # a CPU rank makes the group gloo
    assert trainer.scheduler.resolved_live(trainer.batch) is True


def test_groups_reach_the_worker_setup_and_ray():
    trainer = make(
        batch=BatchConfig(global_batch_size=8, fixed_shares=[1, 3], min_slice=2, seed=7),
        scheduler=SchedulerConfig(plan_sync_every=3, policy=PolicyConfig(window_steps=4)),
        elastic=ElasticConfig(min_workers=1, resize_monitor_interval_s=2.0),
        emulation=EmulationConfig(slowdowns=[SlowdownInjection(factor=2, worker="b")]),
        backend=BackendConfig(torch_backend="gloo", collective_timeout_s=60),
    )
    setup = trainer.setup()
    assert setup.batch == trainer.batch and setup.batch.fixed_shares == (1.0, 3.0)
    assert setup.scheduler.policy.window_steps == 4
    # fixed shares: no live re-planning unless asked
    assert trainer.scheduler.resolved_live(trainer.batch) is False
    assert setup.scheduler.resolved_flush_every() == 3
    assert setup.emulation.slowdowns[0].worker == "b"
    assert setup.backend.collective_timeout_s == 60 and setup.min_workers == 1
    assert setup.max_world_size == 2
    assert trainer.scaling_config().num_workers == (1, 2)
    assert trainer.torch_trainer().backend_config.timeout_s == 60


def test_unknown_keyword_is_a_type_error_naming_where_the_setting_lives():
    with pytest.raises(
        TypeError, match=r"did you mean batch=BatchConfig\(global_batch_size=\.\.\.\)"
    ):
        make(global_batch_size=8)  # the 0.1 spelling: now a field of batch=
    with pytest.raises(TypeError, match=r"'global_batchsize': did you mean batch=BatchConfig"):
        make(global_batchsize=8)
    with pytest.raises(TypeError, match=r"'elastic_resize_monitor_interval_s'.*ElasticConfig"):
        make(elastic_resize_monitor_interval_s=1.0)
    with pytest.raises(TypeError, match=r"'zzz'\. Settings live in their config groups"):
        make(zzz=1)


def test_library_configs_raise_config_error_not_pydantic():
    with pytest.raises(ConfigError) as info:
        BatchConfig(global_batch_size=0, weightng="uniform")
    text = str(info.value)
    assert "BatchConfig: global_batch_size: must be >= 1" in text
    assert "rename it to 'weighting'" in text
    with pytest.raises(ConfigError, match="policy.window_steps: expected a number"):
        SchedulerConfig(policy={"window_steps": True})


def test_admission_auto_makes_the_group_elastic_down_to_one():
    from raytrain_hetero.config import ProbeConfig

    auto = make(probe=ProbeConfig(admission="auto"))
    assert auto.admission_auto and auto.scaling_config().num_workers == (1, 2)
    assert auto.setup().min_workers == 1
    assert auto.torch_trainer()._admission_run_id == auto.run_id
    # elastic.min_workers still bounds the group; all (the default) stays fixed-size.
    bounded = make(probe=ProbeConfig(admission="auto"), elastic=ElasticConfig(min_workers=2))
    assert bounded.scaling_config().num_workers == 2 and bounded.setup().min_workers == 2
    plain = make()
    assert not plain.admission_auto and plain.scaling_config().num_workers == 2
    assert plain.torch_trainer()._admission_run_id is None
    # Fixed shares never probe, so there is nothing to admit by.
    fixed = make(
        probe=ProbeConfig(admission="auto"),
        batch=BatchConfig(global_batch_size=8, fixed_shares=[1, 1]),
    )
    assert not fixed.admission_auto and fixed.scaling_config().num_workers == 2
