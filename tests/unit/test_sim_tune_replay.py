"""The simulator of one recorded search (raytrain_hetero.sim.tune_replay): its model of starts,
epochs, moves at epoch ends, restarts and contention, on small hand-computable searches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import HeteroError
from raytrain_hetero.sim.tune_replay import RecordedRun, RecordedTrial, predict_run

FAST, SLOW = CostModel(0.0, 0.01), CostModel(0.0, 0.04)  # 100 and 25 samples/s


def _run(policy, trials, **kw):
    base = dict(
        policy=policy,
        makespan_s=100.0,
        trials=tuple(trials),
        slots={"fast": 1, "slow": 1} if policy == "auto" else {"any": 2},
        global_batch=100,
        samples_per_epoch=1000,
        max_epochs=4,
        grace_period=1,
        reduction_factor=2.0,
        epoch_overhead_s=2.0,
    )
    base.update(kw)
    return RecordedRun(**base)


def test_fixed_is_launch_start_and_epochs_on_its_own_worker():
    trials = [
        RecordedTrial("a", 1.0, 10.0, 3, {"any": FAST}, "any"),  # 3 x (10 + 2) s
        RecordedTrial("b", 2.0, 20.0, 2, {"any": SLOW}, "any"),  # 2 x (40 + 2) s
    ]
    p = predict_run(_run("fixed", trials, tail_s=5.0))
    assert p.ends_s == pytest.approx((1 + 10 + 36, 2 + 20 + 84))
    assert p.makespan_s == pytest.approx(106 + 5) and p.moves == 0
    assert p.error == pytest.approx(111 / 100 - 1)


def test_fixed_queues_trials_beyond_the_slots():
    trials = [RecordedTrial(t, 0.0, 10.0, 1, {"any": FAST}, "any") for t in "abc"]
    p = predict_run(_run("fixed", trials))
    assert sorted(p.ends_s) == pytest.approx([22, 22, 44])  # c starts when one ends


def test_auto_grows_a_survivor_at_its_epoch_end_and_pays_the_restart():
    a = RecordedTrial("a", 0.0, 10.0, 4, {"fast": FAST})
    b = RecordedTrial("b", 0.0, 10.0, 1, {"fast": FAST})
    run = _run("auto", [a, b], slots={"fast": 2}, restart_s=5.0)
    p = predict_run(run)
    # one worker each: 12 s epochs from 10 s; b stops after its first (22 s) and a, which
    # ASHA may promote (2 epochs expected on 1 worker: 20 s; on 2: 10 s + a 5 s restart),
    # takes b's worker at its next epoch end (34 s): its last two epochs take 5 + 2 s each
    assert p.ends_s == pytest.approx((34 + 5 + 2 * 7, 22.0))
    assert p.moves == 1
    # a restart dearer than what the move saves: no move
    dear = predict_run(replace(run, restart_s=100.0))
    assert dear.moves == 0 and dear.ends_s[0] == pytest.approx(10 + 4 * 12)
    # so is a gain within the measured error: 50 % on the 10 s run and the 5 s restart
    assert predict_run(replace(run, step_error=0.5, restart_error=0.5)).moves == 0


def test_contention_slows_the_trials_running_beside_a_start():
    costs = {"any": FAST}
    early = RecordedTrial("a", 0.0, 0.0, 2, costs, "any")  # runs 0-24 s
    late = RecordedTrial("b", 6.0, 10.0, 1, costs, "any")  # starts 6-16 s
    calm = predict_run(_run("fixed", [early, late]))
    busy = predict_run(_run("fixed", [early, late], contention=0.5))
    assert calm.ends_s[0] == pytest.approx(24.0)
    # during b's 10 s start a runs at 1/1.5: 10 s of its time does 6.67 s of work
    assert busy.ends_s[0] == pytest.approx(24.0 + 10 - 10 / 1.5)
    assert busy.ends_s[1] == calm.ends_s[1]


def test_an_unknown_policy_is_refused():
    with pytest.raises(HeteroError, match="unknown policy 'stock'"):
        predict_run(_run("stock", []))
