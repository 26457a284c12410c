"""The simulated Tune search (raytrain_hetero.sim.tune_search): invariants on a small cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raytrain_hetero.sim.tune_bounds import lower_bound, online_bound
from raytrain_hetero.sim.tune_search import (
    POLICIES,
    TuneSimConfig,
    family_costs,
    family_sync,
    make_cluster,
    make_trials,
    simulate_search,
)

# Two families in the table's format: {config: {workers: {gpu: steps/s summed over workers}}}
TABLE = {
    "Net (batch size 32)": {
        "1": {"k80": 2.0, "p100": 6.0, "v100": 9.0},
        "2": {"k80": 3.6, "p100": 10.0, "v100": 15.0},
    },
    "Net (batch size 64)": {"1": {"k80": 1.1, "p100": 3.4, "v100": 5.2}},
    "Rec (batch size 512)": {"1": {"k80": 30.0, "p100": 45.0, "v100": 20.0}},
    "Rec (batch size 1024)": {"1": {"k80": 18.0, "p100": 28.0, "v100": 12.0}},
}
SMALL = TuneSimConfig(
    trials=10, gpu_nodes=1, gpus_per_node=2, cpu_nodes=1, max_t=9, restart_s=5.0, seed=3
)


@pytest.fixture(scope="module")
def results():
    return {p: simulate_search(TABLE, SMALL, p) for p in POLICIES}


def test_inputs_follow_the_table():
    costs = family_costs(TABLE)
    # two batch sizes: an affine fit through both points (1/9 s at 32, 1/5.2 s at 64)
    v100 = costs["Net"]["v100"]
    assert v100.time(32) == pytest.approx(1 / 9.0) and v100.time(64) == pytest.approx(1 / 5.2)
    sync = family_sync(TABLE)
    # 2 workers: the extra step time 2/thr_2 - 1/thr_1 over the ring's 2(2-1)/2 = 1, median
    extras = [2 / 3.6 - 1 / 2.0, 2 / 10.0 - 1 / 6.0, 2 / 15.0 - 1 / 9.0]
    assert sync["Net"] == pytest.approx(sorted(extras)[1])
    assert sync["Rec"] > 0  # no multi-worker entry: the others' ratio to a V100 step
    _, kinds = make_cluster(SMALL)
    assert sorted(kinds.values()) == ["cpu", "k80", "k80", "p100", "p100", "v100", "v100"]
    assert len(make_trials(TABLE, SMALL)) == SMALL.trials


def test_every_trial_runs_asha_and_work_matches_epochs(results):
    specs = make_trials(TABLE, SMALL)
    for r in results.values():
        assert dict(r.rung_counts)[1] == SMALL.trials  # every trial reaches the first rung
        for spec, epochs, samples in zip(specs, r.epochs_run, r.samples_run):
            assert 1 <= epochs <= SMALL.max_t
            assert samples == pytest.approx(epochs * spec.epoch_samples, rel=1e-9)
        assert r.mean_completion_s <= r.makespan_s


def test_bound_is_below_every_policy(results):
    for r in results.values():
        assert lower_bound(TABLE, SMALL, r.samples_run) <= r.makespan_s * (1 + 1e-9)


def test_the_reachable_online_bound_lies_above_the_clairvoyant_one(results):
    """The idealized online allocator runs ours' work knowing ASHA's probabilities, not its
    draw: a feasible fractional schedule, so never below the clairvoyant LP; deterministic."""
    ours = results["ours"]
    online = online_bound(TABLE, SMALL, ours.epochs_run)
    assert lower_bound(TABLE, SMALL, ours.samples_run) <= online * (1 + 1e-6)
    assert online == online_bound(TABLE, SMALL, ours.epochs_run)
    # more work (every trial to the last epoch) takes longer
    assert online_bound(TABLE, SMALL, [SMALL.max_t] * SMALL.trials) > online


def test_ours_prices_its_moves_when_told(results):
    priced = simulate_search(TABLE, replace(SMALL, step_error=0.5, restart_error=0.5), "ours")
    assert priced.restarts <= results["ours"].restarts
    assert priced.epochs_run and priced.makespan_s > 0


def test_fixed_resources_never_restart_and_ours_decides(results):
    assert results["fifo"].restarts == 0 and results["fifo"].decisions == 0
    assert results["ours"].decisions > 0 and results["ours"].decision_s_max > 0


def test_deterministic_per_seed(results):
    timed = ("decision_s_max", "decision_s_median")  # wall clock: the only difference
    again = simulate_search(TABLE, SMALL, "ours")
    assert replace(again, **dict.fromkeys(timed, 0.0)) == replace(
        results["ours"], **dict.fromkeys(timed, 0.0)
    )
    other = simulate_search(TABLE, replace(SMALL, seed=4), "ours")
    assert other.samples_run != results["ours"].samples_run


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        simulate_search(TABLE, SMALL, "random")
