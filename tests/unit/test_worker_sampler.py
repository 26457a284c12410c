"""The loader with its parts injected (no runtime, no Ray): carving, StepInfo, StepRecords."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.telemetry import Telemetry
from raytrain_hetero.worker.measure.timing import StepTiming
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

SETUP = HeteroSetup(
    run_id="r",
    specs=(WorkerSpec(name="a"), WorkerSpec(name="b")),
    batch=BatchConfig(global_batch_size=12, fixed_shares=(1.0, 2.0)),
)
SIZE = 30  # 2 full steps and a short one of 6 per epoch
START = Cursor(0, 0)


def _loader(rank: int, records: list, cursor: Cursor = START) -> HeteroDataLoader:
    identity = RankIdentity(setup=SETUP, slot=rank, rank=rank, world_size=2, group_id="g")
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(12, [1.0, 2.0]))
    carver = EpochCarver(dataset_size=SIZE, global_batch_size=12, seed=5, min_step_size=2)
    dataset = TensorDataset(torch.arange(SIZE))
    return HeteroDataLoader(
        dataset,
        state=LoaderState(carver, cursor),
        schedule=schedule,
        identity=identity,
        timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
        telemetry=Telemetry(),
        ensure_plan=lambda: None,
        on_step_end=records.append,
    )


def test_two_ranks_see_every_sample_once_and_records_are_typed():
    seen = []
    records: dict[int, list] = {0: [], 1: []}
    for rank in (0, 1):
        loader = _loader(rank, records[rank])
        for (batch,) in loader:
            step = loader.timing.current
            assert step is not None and step.local_count == len(batch)
            loader.telemetry.log({"loss": float(step.global_step)})
            seen.extend(batch.tolist())
        assert loader.epoch == 1 and loader.timing.current is None
    assert sorted(seen) == list(range(SIZE))
    assert [r.step for r in records[0]] == [0, 1, 2]
    assert [r.slice for r in records[0]] == [4, 4, 2]
    assert [r.slice for r in records[1]] == [8, 8, 4]
    assert [r.loss for r in records[1]] == [0.0, 1.0, 2.0]
    first = records[1][0]
    assert first.key == ("g", 1, 0) and first.worker == "b" and first.world_size == 2
    assert first.weight == pytest.approx(8 / 12) and first.plan_version == 1


def test_resumes_mid_epoch_at_the_cursor():
    records: list = []
    loader = _loader(0, records, Cursor(0, 2))
    batches = [b.tolist() for (b,) in loader]
    assert len(batches) == 1 and [r.step for r in records] == [2]
    assert loader.state.cursor == Cursor(1, 0)


def test_batching_arguments_are_refused():
    with pytest.raises(ConfigError, match="batch_size"):
        HeteroDataLoader(
            TensorDataset(torch.arange(4)),
            state=LoaderState(EpochCarver(4, 2, 0, 1), Cursor()),
            schedule=PlanSchedule(),
            identity=RankIdentity(setup=SETUP, slot=0, rank=0, world_size=2),
            timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
            telemetry=Telemetry(),
            ensure_plan=lambda: None,
            on_step_end=lambda record: None,
            batch_size=2,
        )


def test_a_loop_that_stops_at_the_epochs_length_ends_each_step_itself():
    """Lightning's loop: no next() after an epoch's last batch; finish_step records it."""
    records: list = []
    loader = _loader(0, records)
    for _ in range(2):  # two epochs, each iterator left suspended after its last batch
        batches = iter(loader)
        for _ in range(len(loader)):
            next(batches)
            loader.finish_step()
            loader.finish_step()  # a second call ends nothing more
        assert loader.timing.current is None
    assert [r.step for r in records] == [0, 1, 2, 3, 4, 5]


def test_a_superseded_iteration_leaves_the_new_steps_alone():
    records: list = []
    loader = _loader(0, records)
    first = iter(loader)
    next(first)
    loader.finish_step()
    second = iter(loader)
    next(second)  # the next epoch's first step is in progress
    first.close()  # the old generator is finalised late
    assert loader.timing.current is not None


def test_lightning_length_and_loop_state_check_the_cursor():
    """Lightning's view: the whole epoch's length (it restores the batches done itself) and a
    loop state that must agree with the cursor restored from the run's checkpoint."""
    from raytrain_hetero.errors import DataError

    loader = _loader(0, [], Cursor(0, 2))
    assert len(loader) == 1
    loader.len_counts_whole_epoch = True
    assert len(loader) == 3
    assert loader.state_dict() == {"epoch": 0, "step_in_epoch": 2}
    loader.load_state_dict({"epoch": 0, "step_in_epoch": 2})  # agrees: nothing changes
    with pytest.raises(DataError, match="epoch 0 step 1"):
        loader.load_state_dict({"epoch": 0, "step_in_epoch": 1})
    assert loader.state.cursor == Cursor(0, 2)
