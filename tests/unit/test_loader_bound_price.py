"""A worker's price is what its step really costs: the wait for its data included.

A dataset whose ``__getitem__`` sleeps is a slow loader that takes no CPU: a price from compute
(or from this process's CPU time) would call such a worker fast. The passive step records, the
probe and the helper that prices loading with DataLoader processes all follow the loader-bound
rate. Only lower bounds of sleeps are asserted (load can lengthen a sleep, never shorten it).
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.probe import probe_step_costs
from raytrain_hetero.worker.measure.telemetry import Telemetry
from raytrain_hetero.worker.measure.timing import StepTiming, loader_bound_s
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

DELAY_S = 0.004  # per sample read


class SlowStorage(Dataset):
    """Every read waits ``DELAY_S`` (storage or a network file system): loading takes time,
    not this process's CPU."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(DELAY_S)
        return torch.full((3,), float(index))


def test_passive_records_price_the_wait_for_data_not_the_cpu_it_took(one_thread):
    setup = HeteroSetup(
        run_id="r",
        specs=(WorkerSpec(name="a"),),
        batch=BatchConfig(global_batch_size=8, fixed_shares=(1.0,)),
    )
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(8, [1.0]))
    records: list = []
    loader = HeteroDataLoader(
        SlowStorage(32),
        state=LoaderState(EpochCarver(32, 8, seed=1, min_step_size=1), Cursor()),
        schedule=schedule,
        identity=RankIdentity(setup=setup, slot=0, rank=0, world_size=1, group_id="g"),
        timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
        telemetry=Telemetry(),
        ensure_plan=lambda: None,
        on_step_end=records.append,
    )
    for batch in loader:
        assert batch.shape == (8, 3)
    assert len(records) == 4
    for record in records:
        assert record.busy_s >= record.slice * DELAY_S  # the wait is in the price
        assert record.samples_per_s == pytest.approx(record.slice / record.busy_s)
        assert record.samples_per_s <= 1.0 / DELAY_S  # the loader-bound rate, at most
        # What this process spent of its own CPU (compute, collating) is far less: a
        # compute price would have called this worker several times faster.
        assert record.compute_s + record.load_s < record.busy_s / 2


@pytest.mark.parametrize("processes", [0, 2])
def test_the_probe_prices_loading_as_the_training_loader_reads(processes, one_thread):
    # One intra-op thread: the compute clock is the thread's CPU time, which a wait for data
    # does not advance; the loading must still be priced (it is read on the wall clock).
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    dataset = SlowStorage(64)

    def make_batch(size: int) -> torch.Tensor:
        return torch.stack([dataset[i] for i in range(size)])

    result = probe_step_costs(
        model,
        make_batch,
        [2, 8],
        device="cpu",
        loss_fn=lambda m, batch: m(batch).mean(),
        warmup=1,
        repeats=3,
        time_loading=True,
        loader_processes=processes,
    )
    share = 1 if processes == 0 else processes  # k processes read in parallel
    for size, seconds, compute in zip(
        result.batch_sizes, result.seconds, result.compute_seconds, strict=True
    ):
        assert seconds >= size * DELAY_S / share
        assert compute < seconds
    compute_model = result.compute_model()
    assert compute_model is not None
    assert result.cost_model().time(8) > compute_model.time(8)
    plain = probe_step_costs(
        model, make_batch, [2, 8], device="cpu", loss_fn=lambda m, batch: m(batch).mean()
    )
    assert plain.compute_seconds == () and plain.compute_model() is None


def test_loader_processes_hide_loading_up_to_the_compute():
    assert loader_bound_s(0.01, 0.03, 0) == pytest.approx(0.04)  # read, then compute
    assert loader_bound_s(0.01, 0.03, 2) == pytest.approx(0.015)  # the loader binds
    assert loader_bound_s(0.05, 0.03, 2) == pytest.approx(0.05)  # the compute binds
