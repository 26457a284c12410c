"""Loader processes read the next epoch's first slices before the epoch ends, exactly.

The carving loader with DataLoader processes (per-epoch and persistent workers) yields the same
indices in the same order as the in-process loader, resumes mid-epoch, and has the next
epoch's first slice requested from the dataset while the current epoch's last step is still
in progress (an event, waited for; no timing is asserted).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
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
SIZE = 60  # five steps of 12 per epoch; rank 0 reads 4 of each


class RequestLog(Dataset):
    """Item i is i; each request leaves a file named i (written by the loader's processes)."""

    def __init__(self, size: int, directory: Path) -> None:
        self.size = size
        self.directory = directory

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        (self.directory / str(index)).touch()
        return torch.tensor(index)


def _loader(dataset: Dataset, cursor: Cursor = Cursor(0, 0), **kwargs) -> HeteroDataLoader:
    identity = RankIdentity(setup=SETUP, slot=0, rank=0, world_size=2, group_id="g")
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(12, [1.0, 2.0]))
    carver = EpochCarver(dataset_size=SIZE, global_batch_size=12, seed=5, min_step_size=2)
    return HeteroDataLoader(
        dataset,
        state=LoaderState(carver, cursor),
        schedule=schedule,
        identity=identity,
        timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
        telemetry=Telemetry(),
        ensure_plan=lambda: None,
        on_step_end=lambda record: None,
        **kwargs,
    )


def _epochs(loader: HeteroDataLoader, count: int) -> list[list[list[int]]]:
    return [[batch.tolist() for batch in loader] for _ in range(count)]


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_processes_yield_the_carving_in_order_and_resume(tmp_path, persistent):
    dataset = RequestLog(SIZE, tmp_path)
    expected = _epochs(_loader(dataset), 3)
    processes = {"num_workers": 2, "persistent_workers": persistent}
    assert _epochs(_loader(dataset, **processes), 3) == expected
    resumed = _loader(dataset, Cursor(1, 2), **processes)
    assert _epochs(resumed, 2) == [expected[1][2:], expected[2]]
    # A loop that leaves an epoch early resumes at the cursor, not where the stream was.
    loader = _loader(dataset, **processes)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    assert loader.state.cursor == Cursor(0, 2)
    assert _epochs(loader, 2) == [expected[0][2:], expected[1]]


@pytest.mark.parametrize("persistent", [False, True])
def test_next_epochs_first_slice_is_requested_during_the_last_step(tmp_path, persistent):
    (tmp_path / "reference").mkdir()
    reference = _epochs(_loader(RequestLog(SIZE, tmp_path / "reference")), 2)
    log = tmp_path / "log"
    log.mkdir()
    loader = _loader(RequestLog(SIZE, log), num_workers=2, persistent_workers=persistent)
    batches = iter(loader)
    for _ in range(loader.steps_per_epoch):
        next(batches)  # the last step of epoch 0 is now in progress
    wanted = {str(i) for i in reference[1][0]}
    deadline = time.monotonic() + 60
    while not wanted <= {p.name for p in log.iterdir()} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wanted <= {p.name for p in log.iterdir()}, "epoch 1's first slice was not read ahead"
    assert loader.timing.current is not None and loader.timing.current.global_step == 4
    with pytest.raises(StopIteration):
        next(batches)
    assert [b.tolist() for b in loader] == reference[1]
