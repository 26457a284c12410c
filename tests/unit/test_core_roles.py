"""Node roles: a CPU worker feeds the trainers when that adds more samples/s (pure core)."""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.admission import group_samples_per_second
from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.roles import EXACT_UP_TO, decide_roles
from raytrain_hetero.errors import AllocationError

B = 64
GPU = CostModel(alpha=0.001, beta=0.0005)  # ~1900 samples/s alone
CPU = CostModel(alpha=0.001, beta=0.01)  # ~98 samples/s alone


def test_a_cpu_node_feeds_loader_bound_trainers():
    # Two fast trainers fed at 300 samples/s; the CPU node decodes 250 samples/s itself.
    d = decide_roles(
        B,
        [GPU, GPU, CPU],
        candidates=[False, False, True],
        feed_samples_per_s=[0.0, 0.0, 250.0],
        delivery_samples_per_s=300.0,
        names=["gpu-0", "gpu-1", "cpu"],
    )
    assert d.feeders == (2,)
    assert [w.role for w in d.workers] == ["train", "train", "feed"]
    assert d.all_train_samples_per_s == pytest.approx(300.0)  # loader-bound either way
    assert d.chosen_samples_per_s == pytest.approx(550.0)
    assert d.compute_samples_per_s == pytest.approx(
        group_samples_per_second(B, [GPU, GPU], collective_s=0.0)
    )
    assert "cpu (rank 2) feeding" in d.summary() and "loader-bound" in d.summary()
    assert d.to_dict()["feeders"] == [2]


def test_compute_bound_trainers_keep_the_cpu_node_training():
    # The pipeline delivers far more than anyone computes: feeding adds nothing.
    d = decide_roles(
        B,
        [CPU, CPU, CPU],
        candidates=[True, True, True],
        feed_samples_per_s=[500.0] * 3,
        delivery_samples_per_s=float("inf"),
    )
    assert d.feeders == ()
    assert "every worker trains" in d.summary() and "compute-bound" in d.summary()


def test_the_fastest_worker_always_trains_and_bad_lengths_are_refused():
    d = decide_roles(
        B,
        [CPU, GPU],
        candidates=[True, True],
        feed_samples_per_s=[1e6, 1e6],
        delivery_samples_per_s=1.0,
    )
    assert d.workers[1].role == "train" and not d.workers[1].candidate
    with pytest.raises(AllocationError, match="2 cost models, 1 candidate flags"):
        decide_roles(
            B, [CPU, GPU], candidates=[True], feed_samples_per_s=[1.0], delivery_samples_per_s=1.0
        )


_cost = st.builds(
    CostModel,
    alpha=st.floats(0.0, 0.01),
    beta=st.floats(1e-4, 0.05),
)


@settings(max_examples=150, deadline=None)
@given(
    workers=st.lists(
        st.tuples(_cost, st.booleans(), st.floats(0.0, 3000.0)), min_size=1, max_size=6
    ),
    delivery=st.floats(1.0, 5000.0),
    collective=st.floats(0.0, 0.02),
    quantum=st.sampled_from([1, 2, 4, 16, 32]),
)
def test_the_chosen_roles_are_the_best_assignment(workers, delivery, collective, quantum):
    """Also under ghost BatchNorm (``quantum`` g): every prediction from whole-group plans."""
    costs = [c for c, _, _ in workers]
    flags = [f for _, f, _ in workers]
    feed = [r for _, _, r in workers]
    d = decide_roles(
        B,
        costs,
        candidates=flags,
        feed_samples_per_s=feed,
        delivery_samples_per_s=delivery,
        collective_s=collective,
        quantum=quantum,
    )
    n = len(costs)

    def predict(feeders):
        trainers = [costs[r] for r in range(n) if r not in feeders]
        compute = group_samples_per_second(
            B, trainers, collective_s=collective if len(trainers) > 1 else 0.0, quantum=quantum
        )
        return min(compute, delivery + sum(feed[r] for r in feeders))

    pool = [w.rank for w in d.workers if w.candidate]
    assert len(pool) <= n - 1 and all(flags[r] for r in pool)
    best = max(
        predict({r for r, bit in zip(pool, bits, strict=True) if bit})
        for bits in product([0, 1], repeat=len(pool))
    )
    assert d.chosen_samples_per_s == pytest.approx(best)
    assert d.chosen_samples_per_s == pytest.approx(predict(set(d.feeders)))
    assert d.chosen_samples_per_s >= d.all_train_samples_per_s
    assert set(d.feeders) <= set(pool)
    # Never above what the pipeline and the feeders deliver, nor what the trainers compute.
    assert d.chosen_samples_per_s <= d.delivery_samples_per_s + sum(feed[r] for r in d.feeders)
    assert d.chosen_samples_per_s <= d.compute_samples_per_s + 1e-9
    # A feeder is only chosen if it strictly helps (ties keep the stock role).
    if d.feeders:
        assert d.chosen_samples_per_s > d.all_train_samples_per_s
    # The chosen trainers' compute is that of a plan in whole groups (the run's plan).
    trainers = [costs[w.rank] for w in d.workers if w.role == "train"]
    if d.compute_samples_per_s > 0:
        slices = allocate(B, trainers, quantum=quantum)
        assert all(b > 0 and b % quantum == 0 for b in slices)
        step = makespan(slices, trainers) + (collective if len(trainers) > 1 else 0.0)
        assert d.compute_samples_per_s == pytest.approx(B / step)
    else:  # fewer whole groups than trainers: no plan at all
        assert B // quantum < len(trainers)


def test_ghost_groups_fewer_than_trainers_make_a_feeder_of_a_candidate():
    # B = 64 in groups of 32 holds 2 groups: three trainers cannot all take one. Planned in
    # single samples the CPU node would keep training (feeding adds nothing: a tie).
    args = dict(
        candidates=[False, False, True],
        feed_samples_per_s=[0.0, 0.0, 0.0],
        delivery_samples_per_s=300.0,
    )
    assert decide_roles(B, [GPU, GPU, CPU], **args).feeders == ()
    d = decide_roles(B, [GPU, GPU, CPU], quantum=32, **args)
    assert d.all_train_compute_samples_per_s == 0.0 and d.all_train_samples_per_s == 0.0
    assert d.feeders == (2,) and d.chosen_samples_per_s == pytest.approx(300.0)
    # Whole groups also change the trainers' predicted compute (a slice of 24 is not a plan).
    slow = CostModel(alpha=0.001, beta=0.002)
    single = decide_roles(
        B,
        [GPU, slow],
        candidates=[False, False],
        feed_samples_per_s=[0.0, 0.0],
        delivery_samples_per_s=float("inf"),
    )
    ghost = decide_roles(B, [GPU, slow], candidates=[False, False],
                         feed_samples_per_s=[0.0, 0.0], delivery_samples_per_s=float("inf"),
                         quantum=16)  # fmt: skip
    assert ghost.compute_samples_per_s < single.compute_samples_per_s
    assert ghost.compute_samples_per_s == pytest.approx(
        group_samples_per_second(B, [GPU, slow], collective_s=0.0, quantum=16)
    )


def test_many_candidates_use_ratio_prefixes_and_never_lose_to_all_training():
    n = EXACT_UP_TO + 3
    d = decide_roles(
        B,
        [GPU] + [CPU] * (n - 1),
        candidates=[False] + [True] * (n - 1),
        feed_samples_per_s=[0.0] + [100.0 + r for r in range(n - 1)],
        delivery_samples_per_s=200.0,
    )
    assert d.feeders and d.chosen_samples_per_s > d.all_train_samples_per_s
    # The best feeders (highest feed per train) are the ones chosen.
    assert max(range(1, n)) in d.feeders
