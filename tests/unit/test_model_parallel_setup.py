"""Model-parallel setup without Ray: HeteroTrainer(parallel=...) validation, group reading.

Group reading: in a model-parallel mode every rank of a group reads its replica's slice (the
union of its members' plan slices); the groups' slices tile each global batch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.data import TensorDataset

from raytrain_hetero import ConfigError, HeteroTrainer, ModelParallelError, WorkerSpec
from raytrain_hetero.config import BatchConfig, ElasticConfig, ParallelConfig
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.parallel.layout import ParallelLayout
from raytrain_hetero.worker.data.sampler import CarvingBatchSampler, HeteroDataLoader, LoaderState
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.telemetry import Telemetry
from raytrain_hetero.worker.measure.timing import StepTiming
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity


def loop(config):  # never runs: construction fails first
    raise AssertionError


def workers(n: int) -> list[WorkerSpec]:
    return [WorkerSpec(name=f"w{i}") for i in range(n)]


def make(n: int = 4, **kwargs):
    args = {"workers": workers(n), "batch": BatchConfig(global_batch_size=16)}
    args.update(kwargs)
    return HeteroTrainer(loop, **args)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (
            lambda: make(3, parallel={"mode": "conv_split", "layers": ["c"], "group_size": 2}),
            "parallel.group_size: group_size 2 does not divide the 3 worker(s)",
        ),
        (
            lambda: make(
                4,
                parallel={"mode": "conv_split", "layers": ["c"], "group_size": 2},
                elastic=ElasticConfig(min_workers=1),
            ),
            "elastic world sizes [1, 3] (elastic.min_workers 1 to 4 worker slots)",
        ),
        (
            lambda: make(1, parallel={"mode": "branches"}),
            "splits the model over all workers, but the run may have 1",
        ),
        (
            lambda: make(2, parallel={"mode": "branches"}, elastic=ElasticConfig(min_workers=1)),
            "set elastic.min_workers >= 2",
        ),
        (
            lambda: make(
                2,
                parallel={"mode": "branches"},
                batch=BatchConfig(global_batch_size=16, weighting="uniform"),
            ),
            "batch.weighting: 'uniform' with parallel.mode 'branches'",
        ),
        (lambda: make(2, parallel={"mode": "conv_split"}), "conv_split needs the layers"),
        (
            lambda: make(2, parallel={"mode": "branches", "layers": ["c"]}),
            "layers are only used by mode conv_split",
        ),
        (
            lambda: make(2, parallel={"mode": "conv_split", "layers": ["c"], "group_size": 1}),
            "a conv_split group of one rank splits nothing",
        ),
        (lambda: make(2, parallel={"mode": "pipeline"}), "ParallelConfig: mode: must be one of"),
        (lambda: make(2, parallel=3), "expected a ParallelConfig"),
    ],
)
def test_bad_parallel_layouts_are_refused_at_construction(build, fragment):
    with pytest.raises(ConfigError) as info:
        build()
    assert fragment in str(info.value)


def test_a_valid_layout_reaches_the_workers_setup():
    parallel = ParallelConfig(mode="conv_split", layers=("conv1",), group_size=2)
    trainer = make(4, parallel=parallel)
    assert trainer.setup().parallel == parallel
    assert make(2).setup().parallel == ParallelConfig()  # data parallelism by default
    setup = trainer.setup()
    assert [setup.reading_group(r, 4) for r in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert make(2).setup().reading_group(1, 2) == (1,)


def test_layout_texts_name_kernels_or_branches_per_rank():
    groups = ((0, 1), (2, 3))
    conv = ParallelLayout.build("conv_split", groups, kernels=[("conv1", (5, 3)), ("c2", (9, 7))])
    assert [conv.text(r) for r in range(4)] == ["conv1:5 c2:9", "conv1:3 c2:7"] * 2
    branches = ParallelLayout.build(
        "branches", groups, branch_ranks=[("s1", 1), ("s2", 0)], head_position=0
    )
    assert [branches.text(r) for r in range(4)] == ["s2+head", "s1"] * 2
    assert branches.ranks[3].replica == 1 and branches.ranks[3].position == 1


# ----------------------------------------------------------------------------- group reading

SIZE, BATCH, WORLD = 50, 16, 4
SHARES = [1.0, 3.0, 2.0, 2.0]


def _setup(parallel: ParallelConfig) -> HeteroSetup:
    return HeteroSetup(
        run_id="r",
        specs=tuple(workers(WORLD)),
        batch=BatchConfig(global_batch_size=BATCH, fixed_shares=tuple(SHARES)),
        parallel=parallel,
    )


def _carver() -> EpochCarver:
    return EpochCarver(dataset_size=SIZE, global_batch_size=BATCH, seed=3, min_step_size=WORLD)


def _schedule() -> PlanSchedule:
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(BATCH, SHARES))
    return schedule


def _epoch_batches(setup: HeteroSetup, rank: int, epoch: int = 0) -> list[list[int]]:
    sampler = CarvingBatchSampler(_carver(), _schedule(), rank, setup.reading_group(rank, WORLD))
    sampler.set_position(epoch, 0)
    return list(sampler)


def test_every_rank_of_a_group_reads_the_same_slices_and_each_sample_once_per_epoch():
    setup = _setup(ParallelConfig(mode="conv_split", layers=("c",), group_size=2))
    for epoch in (0, 1):
        batches = {rank: _epoch_batches(setup, rank, epoch) for rank in range(WORLD)}
        assert batches[0] == batches[1] and batches[2] == batches[3]
        assert batches[0] != batches[2]
        seen = [i for rank in (0, 2) for step in batches[rank] for i in step]
        assert sorted(seen) == list(range(SIZE))  # every sample once per epoch
        # A replica's slice is the sum of its members' plan slices (contiguous in the batch).
        data = _setup(ParallelConfig())
        own = {rank: _epoch_batches(data, rank, epoch) for rank in range(WORLD)}
        for step in range(len(batches[0])):
            assert batches[0][step] == own[0][step] + own[1][step]
            assert batches[2][step] == own[2][step] + own[3][step]


def test_one_group_of_all_ranks_reads_the_whole_global_batch():
    setup = _setup(ParallelConfig(mode="branches"))
    carver = _carver()
    permutation = carver.permutation(0).tolist()
    for rank in range(WORLD):
        for k, ids in enumerate(_epoch_batches(setup, rank)):
            lo, hi = carver.step_bounds(k)
            assert ids == permutation[lo:hi]


def test_the_loader_reads_its_group_and_keeps_the_per_rank_step_counts():
    setup = _setup(ParallelConfig(mode="conv_split", layers=("c",), group_size=2))
    identity = RankIdentity(setup=setup, slot=1, rank=1, world_size=WORLD, group_id="g")
    loader = HeteroDataLoader(
        TensorDataset(torch.arange(SIZE)),
        state=LoaderState(_carver(), Cursor(0, 0)),
        schedule=_schedule(),
        identity=identity,
        timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
        telemetry=Telemetry(),
        ensure_plan=lambda: None,
        on_step_end=lambda record: None,
    )
    for (batch,) in loader:
        step = loader.timing.current
        assert len(batch) == step.counts[0] + step.counts[1]  # the replica's slice
        assert step.local_count == step.counts[1]  # the data plan stays per rank


def test_a_reading_group_must_be_consecutive_and_hold_the_reader():
    with pytest.raises(ConfigError, match="consecutive ranks containing the reader"):
        CarvingBatchSampler(_carver(), _schedule(), 0, (1, 2))
    with pytest.raises(ConfigError, match="consecutive"):
        CarvingBatchSampler(_carver(), _schedule(), 0, (0, 2))


def test_prepare_model_parallel_refuses_data_mode():
    from raytrain_hetero.parallel.training import prepare_model_parallel
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime

    setup = dataclasses.replace(_setup(ParallelConfig()), specs=tuple(workers(WORLD)))
    identity = RankIdentity(setup=setup, slot=0, rank=0, world_size=1)
    install_runtime(WorkerRuntime.start(identity))
    with pytest.raises(ModelParallelError, match="call raytrain_hetero.prepare_model"):
        prepare_model_parallel(torch.nn.Linear(2, 2), example_input=torch.zeros(1, 2))
