"""The cheap start on a real 2-rank gloo group (no Ray): a prior plan at step 0, the measured
plan agreed at the end of the timed steps, and cost models remembered with the run's storage
under a key that a changed model or worker type does not match."""

from __future__ import annotations

import pytest
import torch
from gloo_group import run_gloo_group
from torch.utils.data import TensorDataset, default_collate

from raytrain_hetero.config import BatchConfig, ProbeConfig, WorkerSpec
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.storage import storage_location
from raytrain_hetero.worker.measure.probe import cost_key, default_probe_loss
from raytrain_hetero.worker.plan.calibration import (
    ProbeInputs,
    known_costs,
    passive_step,
    prior_plan,
    starts_passive,
)
from raytrain_hetero.worker.plan.planning import PlanState, gather_rank_slots, install_plan
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

PER_SAMPLE_S = (0.001, 0.003)  # speeds 1 and 1/3, as hetero2


def _setup(storage: str, slow: float = 3.0) -> HeteroSetup:
    return HeteroSetup(
        run_id="r",
        specs=(WorkerSpec(name="fast"), WorkerSpec(name="slow", emulated_slowdown=slow)),
        batch=BatchConfig(global_batch_size=192),
        probe=ProbeConfig(passive_steps=3),
        storage=storage_location(storage),
    )


def _inputs() -> ProbeInputs:
    data = TensorDataset(torch.randn(8, 6), torch.zeros(8))
    return ProbeInputs(data, default_collate, default_probe_loss, time_loading=True)


def _record(rank: int, step: int, slice_: int, version: int) -> StepRecord:
    busy = slice_ * PER_SAMPLE_S[rank]
    return StepRecord(
        step=step, epoch=0, rank=rank, worker="w", device="cpu", slice=slice_, weight=0.5,
        compute_s=busy, load_s=0.0, busy_s=busy, samples_per_s=slice_ / busy, loss=0.0,
        global_samples_per_s=0.0, plan_version=version, group="g", world_size=2, wall_s=busy,
        time=1000.0 + step,
    )  # fmt: skip


def _one_start(rank: int, world: int, storage: str, slow: float) -> dict:
    """A group's first plan and the steps after it, as the loader drives them."""
    identity = RankIdentity(_setup(storage, slow), slot=rank, rank=rank, world_size=world)
    plans = PlanState()
    gather_rank_slots(identity, plans)
    model = torch.nn.Linear(6, 2)
    known = known_costs(identity, plans, model, _inputs(), stored=True)
    first = install_plan(plans, prior_plan(identity, plans, known, start=0))
    switched = []
    for step in range(6):
        plans.schedule.carved_through = step  # the loader carved this step (no prefetch)
        slices = plans.schedule.plan_for(step).slices
        measured = passive_step(identity, plans, _record(rank, step, slices[rank], first.version))
        if measured is not None:
            switched.append(install_plan(plans, measured))
    return {"passive": starts_passive(identity), "first": first, "switched": switched}


def _one_worker_start(rank: int, world: int, storage: str) -> dict:
    """A one-worker group's start: the prior plan stays (nothing to split), and what the
    passive window measured is still the group's newest cost model."""
    setup = HeteroSetup(
        run_id="r",
        specs=(WorkerSpec(name="solo"),),
        batch=BatchConfig(global_batch_size=192),
        probe=ProbeConfig(passive_steps=3),
        storage=storage_location(storage),
    )
    identity = RankIdentity(setup, slot=rank, rank=rank, world_size=world)
    plans = PlanState()
    gather_rank_slots(identity, plans)
    known = known_costs(identity, plans, torch.nn.Linear(6, 2), _inputs(), stored=True)
    first = install_plan(plans, prior_plan(identity, plans, known, start=0))
    before = plans.newest_costs()
    switched = []
    for step in range(6):
        plans.schedule.carved_through = step
        measured = passive_step(identity, plans, _record(rank, step, 192, first.version))
        if measured is not None:
            switched.append(install_plan(plans, measured))
    return {
        "before": before,
        "switched": switched,
        "plan_costs": plans.current.costs,
        "newest": plans.newest_costs(),
    }


def test_a_one_worker_group_keeps_its_measured_costs_though_its_plan_stays(tmp_path):
    (solo,) = run_gloo_group(_one_worker_start, 1, str(tmp_path / "runs")).values()
    assert solo["before"] is None and solo["switched"] == [] and solo["plan_costs"] is None
    (cost,) = solo["newest"]
    assert cost.time(192) == pytest.approx(192 * PER_SAMPLE_S[0], rel=0.05)


def _three_runs(rank: int, world: int, storage: str) -> list[dict]:
    """A fresh run, the same again, then one with another slow worker type (one store)."""
    return [_one_start(rank, world, storage, slow) for slow in (3.0, 3.0, 5.0)]


def test_equal_prior_then_measured_plan_then_remembered(tmp_path):
    runs = str(tmp_path / "runs")
    by_rank = run_gloo_group(_three_runs, 2, runs)
    fresh, again, changed = ({r: by_rank[r][i] for r in (0, 1)} for i in range(3))
    assert fresh[0] == fresh[1]  # every rank agrees on every plan
    first, switched = fresh[0]["first"], fresh[0]["switched"]
    assert fresh[0]["passive"]
    assert first.slices == (96, 96) and first.reason.startswith("prior: equal slices")
    assert "steps 1-3 timed" in first.reason
    # Decided at the end of step 3 (timed steps 1..3), in force from the first uncarved step.
    (measured,) = switched
    assert measured.slices == (144, 48) and measured.effective_step == 4
    assert measured.reason.startswith("measured: ") and measured.version == first.version + 1
    stored = list((tmp_path / "runs" / ".raytrain_hetero" / "cost_models").glob("*.json"))
    assert len(stored) == 3  # one per worker type: fast, slow x3, slow x5

    # The next run on the same storage, model and worker types starts from them: no switch.
    assert again[0]["first"].slices == (144, 48), again[0]["first"]
    assert "remembered cost models of ranks [0, 1]" in again[0]["first"].reason
    assert again[0]["switched"] == []

    # Another slow worker type (its emulated slowdown changed): only the fast type is
    # remembered; the slow one is guessed at the fast one's speed and measured again.
    assert "remembered cost models of ranks [0]" in changed[0]["first"].reason
    assert changed[0]["first"].slices == (96, 96)
    assert [p.slices for p in changed[0]["switched"]] == [(144, 48)]


def test_cost_key_changes_with_the_model_input_and_worker_type_only():
    base = dict(setup={"batchnorm": "exact"}, device="cpu")
    spec = WorkerSpec(name="fast-0", resources={"CPU": 1})
    model = torch.nn.Linear(6, 2)
    batch = (torch.zeros(1, 6), torch.zeros(1))
    key = cost_key(model, batch, spec, **base).digest
    same = [
        cost_key(torch.nn.Linear(6, 2), batch, spec, **base),  # other weights, same model
        cost_key(model, batch, spec.model_copy(update={"name": "fast-1"}), **base),
        cost_key(model, (torch.ones(4, 6), torch.ones(4)), spec, **base),  # batch size
    ]
    # A tune.allocation: auto worker pinned to one node of its type (Ray's node-id label):
    # nodes of a type share one key; the type's own labels still tell types apart.
    typed = spec.model_copy(update={"label_selector": {"speed": "fast"}})
    pinned = [
        typed.model_copy(update={"label_selector": {"speed": "fast", "ray.io/node-id": node}})
        for node in ("n1", "n2")
    ]
    assert {cost_key(model, batch, s, **base).digest for s in [typed, *pinned]} == {
        cost_key(model, batch, typed, **base).digest
    }
    only_pinned = spec.model_copy(update={"label_selector": {"ray.io/node-id": "n1"}})
    assert cost_key(model, batch, only_pinned, **base).digest == key
    assert {k.digest for k in same} == {key}
    changed = [
        cost_key(torch.nn.Linear(6, 3), batch, spec, **base),  # parameter shapes
        cost_key(torch.nn.Linear(6, 2).double(), batch, spec, **base),  # dtype
        cost_key(torch.nn.Sequential(torch.nn.Linear(6, 2)), batch, spec, **base),  # modules
        cost_key(model, (torch.zeros(1, 7), torch.zeros(1)), spec, **base),  # input shape
        cost_key(model, batch, spec.model_copy(update={"emulated_slowdown": 2.0}), **base),
        cost_key(model, batch, spec.model_copy(update={"resources": {"CPU": 2}}), **base),
        cost_key(model, batch, spec, setup={"batchnorm": "local"}, device="cpu"),
        cost_key(model, batch, typed, **base),  # a type's labels
    ]
    assert len({k.digest for k in changed} | {key}) == len(changed) + 1


def test_store_ignores_an_unreadable_entry(tmp_path):
    store = storage_location(tmp_path).cost_models()
    assert store.read("abc") is None
    store.write("abc", 0.5, 0.25, {"what": "test"})
    assert (store.read("abc").alpha, store.read("abc").beta) == (0.5, 0.25)
    (tmp_path / ".raytrain_hetero" / "cost_models" / "abc.json").write_text("{torn")
    assert store.read("abc") is None
