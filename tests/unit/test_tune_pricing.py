"""The search's allocator prices moves as measured where it runs (issue 44 items 1-2): the
epochs and starts the trials report, the prices it derives, the log of every move and
decision, and the replay of a recorded search's stops. No Ray cluster: the allocator as an
object, the replay scheduler with stand-in trials."""

from __future__ import annotations

import csv
import json

import pytest
from ray.tune.schedulers import TrialScheduler

from raytrain_hetero.config.allocation import TrialAllocatorConfig
from raytrain_hetero.core.move_pricing import PRIOR_CONTENTION, PRIOR_ERROR
from raytrain_hetero.core.trial_allocation import ClusterNode, WorkerType
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.tune.allocator import TrialAllocator
from raytrain_hetero.tune.replay import PromotionReplay, PromotionSchedule, trial_index
from raytrain_hetero.tune.results import (
    add_allocation_history,
    write_allocation_log,
    write_trials_csv,
)

FAST = WorkerType("fast", {"CPU": 1.0}, {"speed": "fast"})
SLOW = WorkerType("slow", {"CPU": 1.0}, {"speed": "slow"})


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _cluster(fast: int = 2, slow: int = 2):
    return [ClusterNode(f"f{i}", {"CPU": 1.0}, {"speed": "fast"}) for i in range(fast)] + [
        ClusterNode(f"s{i}", {"CPU": 1.0}, {"speed": "slow"}) for i in range(slow)
    ]


def _allocator(nodes, *, restart_s=None, clock=None, cap=4, trials=None):
    return TrialAllocator(
        (FAST, SLOW),
        lambda: list(nodes),
        max_epochs=8,
        samples_per_epoch=1280,
        config=TrialAllocatorConfig(max_workers_per_trial=cap, restart_s=restart_s),
        clock=clock or Clock(0.0),
        wall_clock=Clock(1000.0),
        expected_trials=trials,
    )


def test_epochs_and_starts_become_the_prices():
    alloc = _allocator(_cluster(fast=1, slow=2), cap=1)
    for t in "abc":  # a on the fast node, b and c on slow ones
        alloc.request(t, global_batch=128)
    assert alloc.holding("a").workers[0].worker_type == "fast"
    prices = alloc.prices()
    assert (prices.step_error, prices.contention) == (PRIOR_ERROR, PRIOR_CONTENTION)
    assert prices.restart_s == 30.0 and prices.epochs == 0
    fast = {"fast": (0.0, 0.01)}  # 10 steps of 1.28 s: a 12.8 s epoch
    # a's epochs: 14 s each (1.2 s outside the steps), then one that overlapped b's
    # restart for all its length and took 21 s
    wall = 0.0
    for k, seconds in enumerate((14.0, 14.0, 14.0, 14.0), start=1):
        alloc.epoch_ended("a", k, costs=fast, epoch_window=(wall, wall + seconds))
        wall += seconds
    alloc.epoch_ended("b", 1, start_s=40.0, resumed=True, start_window=(wall, wall + 40.0))
    for k in (5, 6, 7):
        alloc.epoch_ended("a", k, epoch_window=(wall, wall + 21.0))
        wall += 13.3  # each overlaps the 40 s start over 13.3/21 of it, then 19/21, ...
    prices = alloc.prices()
    assert prices.epochs == 7 and prices.starts == 1 and prices.restarts == 1
    assert prices.epoch_overhead_s == pytest.approx(1.2)
    assert prices.restart_s == 40.0 and prices.restart_error == PRIOR_ERROR
    assert 0.3 < prices.contention <= 1.0  # 21 s against 14 s while b started
    # three of seven epochs missed the prediction by half: a large measured error
    assert prices.step_error == pytest.approx(0.5, abs=0.05)
    # an epoch of a type nobody measured predicts nothing (its prior is not a measurement)
    alloc.epoch_ended("c", 1, epoch_window=(0.0, 30.0))
    assert alloc.prices().epochs == 7


def test_every_move_and_decision_says_its_gain_cost_and_margin(tmp_path):
    clock = Clock(0.0)
    nodes = _cluster(fast=2, slow=0)
    alloc = _allocator(nodes, restart_s=2.0, clock=clock, trials=2)  # one worker each
    alloc.request("a", global_batch=128)
    alloc.request("b", global_batch=128)
    for k in range(1, 4):  # measured: 10 s epochs exactly as predicted
        alloc.epoch_ended(
            "a", k, costs={"fast": (0.0, 0.0078125)}, epoch_window=(10 * k, 10 * k + 10)
        )
    clock.now = 50.0
    alloc.release("b", "stopped by ASHA")  # a may grow: 5 epochs of 10 s left on one worker
    grown = alloc.epoch_ended("a", 4)
    assert grown is not None and len(grown.workers) > 1
    move = alloc.history()[-1]
    assert move.is_move and move.gain_s > move.cost_s + move.margin_s > 0
    assert move.cost_s == pytest.approx(2.0)  # the restart; nobody else runs to contend
    assert "error margin" in move.reason
    kept = [d for d in alloc.decisions() if not d.changed]
    assert kept and all(d.reason.startswith("kept the current holdings") for d in kept)
    rows = [{"trial_id": "a", "status": "completed"}, {"trial_id": "b", "status": "stopped"}]
    add_allocation_history(rows, alloc.history(), alloc.fit_starts())
    write_trials_csv(rows, tmp_path / "trials.csv")
    with open(tmp_path / "trials.csv", newline="") as fh:
        read = {r["trial_id"]: r for r in csv.DictReader(fh)}
    assert (
        read["a"]["moves"].startswith("50.0s gain ") and ", cost 2.0, margin " in read["a"]["moves"]
    )
    assert read["b"]["moves"] == ""
    path = write_allocation_log(
        tmp_path / "allocation_log.json",
        events=alloc.history(),
        decisions=alloc.decisions(),
        fit_starts=alloc.fit_starts(),
        prices=alloc.prices(),
        wall_start=alloc.wall_start(),
    )
    log = json.loads(path.read_text())
    assert log["wall_start"] == 1000.0 and log["prices"]["restart_s"] == 2.0
    assert [e["gain_s"] is not None for e in log["events"]].count(True) == 1
    assert len(log["decisions"]) == len(alloc.decisions())


class _Trial:
    def __init__(self, index: int, config: dict) -> None:
        self.trial_id = f"ab12c_{index:05d}"
        self.config = config


def test_the_replay_stops_each_trial_where_the_recorded_search_stopped_it(tmp_path):
    schedule = PromotionSchedule((2, 1, 4), ({"train.lr": 0.1}, {"train.lr": 0.02}, {}), "test")
    replay = PromotionReplay(PromotionSchedule.load(schedule.save(tmp_path / "s.json")))
    for i, lr in enumerate((0.1, 0.02, 0.3)):
        replay.on_trial_add(None, _Trial(i, {"train.lr": lr, "train.weight_decay": 0.0}))
    decisions = {
        (i, epoch): replay.on_trial_result(None, _Trial(i, {}), {"training_iteration": epoch})
        for i, budget in enumerate(schedule.epochs)
        for epoch in range(1, budget + 1)
    }
    stops = {k for k, v in decisions.items() if v == TrialScheduler.STOP}
    assert stops == {(0, 2), (1, 1), (2, 4)}  # whatever the order or the scores
    assert replay.stopped == {"ab12c_00000": 2, "ab12c_00001": 1, "ab12c_00002": 4}


def test_a_replay_refuses_a_search_that_drew_otherwise():
    replay = PromotionReplay(PromotionSchedule((2, 1), ({"train.lr": 0.1}, {"train.lr": 0.2}), "x"))
    with pytest.raises(ConfigError, match=r"trial 1 drew train.lr=0.3 but the schedule \(x\)"):
        replay.on_trial_add(None, _Trial(1, {"train.lr": 0.3}))
    with pytest.raises(ConfigError, match="records 2 trials"):
        replay.on_trial_add(None, _Trial(2, {}))
    with pytest.raises(ConfigError, match="does not end in its sample index"):
        trial_index("no-index")
    with pytest.raises(ConfigError, match=">= 1 epoch per trial"):
        PromotionSchedule((2, 0))
