"""The group decision: each worker trains, feeds or stands by (pure core, hypothesis-tested)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.group_decision import decide_group
from raytrain_hetero.core.group_price import (
    ExchangePrice,
    LinkCost,
    WorkerPrice,
    compute_cost,
    loading_per_sample,
    noise_margin,
    price_exchange,
    synchronised_makespan,
)
from raytrain_hetero.core.group_retake import (
    check_retake,
    group_step_s,
    reprice_from_steps,
    settle_retake,
)
from raytrain_hetero.errors import AllocationError

B = 192
FREE = ExchangePrice.free()
GLOO = ExchangePrice(gradient_bytes=4e6, gloo=LinkCost(1e-4, 1e9))


def cpu(name: str, beta: float, alpha: float = 0.002, **kw) -> WorkerPrice:
    return WorkerPrice(name, step=CostModel(alpha, beta), **kw)


# ------------------------------------------------------------------------- the cpu-gpu shape


def cpu_gpu_workers(feed: float = 0.0) -> list[WorkerPrice]:
    """The lent H200's figures: a loader-bound GPU (11k/s, compute 34.5k/s) and three CPU
    ranks of 40 ms a step for a dozen samples, each able to load ``feed`` samples/s."""
    gpu = WorkerPrice(
        "gpu",
        step=CostModel(0.005, 1 / 11000),
        compute=CostModel(0.002, 1 / 34500),
        device="cuda",
    )
    return [gpu, *(cpu(f"cpu-{i}", 1 / 400, 0.035, feed_samples_per_s=feed) for i in range(3))]


STAGED = ExchangePrice(
    gradient_bytes=2.4e6,
    gloo=LinkCost(2e-3, 2e8),
    nccl=LinkCost(1e-5, 1e11),
    batchnorm_layers=4,
    batchnorm_bytes=1280,
    host_bytes_per_s=2e9,
)


def test_the_gpu_alone_beats_cpu_ranks_behind_a_host_staged_gloo_exchange():
    decision = decide_group(1024, cpu_gpu_workers(), STAGED, noise=0.05, mode="train")
    assert decision.trainers == (0,) and decision.standing_by == (1, 2, 3)
    assert decision.everyone.exchange.backend == "gloo"
    assert decision.chosen.samples_per_s > decision.everyone.samples_per_s * (1 + decision.margin)
    assert decision.gain == pytest.approx(
        decision.chosen.samples_per_s / decision.everyone.samples_per_s - 1
    )
    assert decision.chosen.slices == (1024, 0, 0, 0)
    assert "stands by" in decision.workers[1].reason
    assert "train gpu; feed -; stand by cpu-0, cpu-1, cpu-2" in decision.summary()
    assert decision.to_dict()["standing_by"] == [1, 2, 3]


def test_cpu_ranks_that_can_load_feed_the_loader_bound_gpu_instead():
    decision = decide_group(1024, cpu_gpu_workers(feed=4000), STAGED, noise=0.05)
    assert decision.trainers == (0,) and decision.feeders == (1, 2, 3)
    assert decision.chosen.bound == "loading"
    fed = decision.chosen.samples_per_s
    alone = decision.workers[0].alone_samples_per_s
    assert fed == pytest.approx(alone + 3 * 4000)
    feeder = decision.workers[1]
    assert feeder.verdict == "feed" and feeder.slice == 0
    assert "feeds 4000.0 samples/s of loading" in feeder.reason


def test_feeding_stops_where_the_trainers_compute_binds():
    # Compute 34.5k/s; the GPU's loader-bound 10.4k/s + one feeder of 30k/s saturates it.
    workers = cpu_gpu_workers()
    workers[1] = cpu("cpu-0", 1 / 400, 0.035, feed_samples_per_s=30000)
    workers[2] = cpu("cpu-1", 1 / 400, 0.035, feed_samples_per_s=30000)
    decision = decide_group(1024, workers, STAGED, noise=0.05)
    assert decision.feeders == (1,) and decision.standing_by == (2, 3)
    assert decision.chosen.bound == "compute"


def test_a_merely_slow_worker_trains_and_equal_workers_all_train():
    decision = decide_group(B, [cpu("a", 1e-3), cpu("b", 2e-3)], GLOO, noise=0.05)
    assert decision.trainers == (0, 1) and decision.gain == 0.0
    equal = decide_group(B, [cpu(f"w{i}", 1e-3) for i in range(4)], GLOO, noise=0.0)
    assert equal.trainers == (0, 1, 2, 3)


def test_a_slow_link_leaves_its_worker_out_wherever_it_is_listed():
    for where in range(3):
        workers = [cpu("a", 1e-3), cpu("b", 1e-3)]
        workers.insert(where, cpu("slow", 2e-2, exchange_delay_s=0.3))
        decision = decide_group(B, workers, GLOO, noise=0.05)
        assert decision.standing_by == (where,)
        assert decision.preference[-1] == where


def test_the_exchange_of_a_group_is_priced_per_backend():
    gpu = WorkerPrice("g", step=CostModel(0.0, 1e-4), device="cuda")
    host = cpu("c", 1e-3)
    nccl = price_exchange([gpu, gpu], STAGED)
    mixed = price_exchange([gpu, host], STAGED)
    cpus = price_exchange([host, host], STAGED)
    assert (nccl.backend, mixed.backend, cpus.backend) == ("nccl", "gloo", "gloo")
    staging = 2 * (2.4e6 + 4 * 1280) / 2e9
    assert mixed.exposed_s == pytest.approx(cpus.exposed_s + staging)
    assert nccl.exposed_s < cpus.exposed_s
    assert price_exchange([host], STAGED).exposed_s == 0.0
    # BatchNorm: two exchanges per layer, never hidden; overlap hides the gradient only.
    hidden = ExchangePrice(gradient_bytes=2.4e6, gloo=LinkCost(2e-3, 2e8), overlap=1.0)
    assert price_exchange([host, host], hidden).exposed_s == 0.0
    bn = ExchangePrice(
        gradient_bytes=2.4e6, gloo=LinkCost(2e-3, 2e8), overlap=1.0, batchnorm_layers=3
    )
    assert price_exchange([host, host], bn).exposed_s == pytest.approx(3 * 2 * 2 * 2e-3)


def test_a_measured_gradient_all_reduce_replaces_the_price_of_its_group():
    workers = [cpu("a", 1e-3), cpu("b", 1e-3), cpu("c", 1e-3)]
    priced = decide_group(B, workers, FREE, noise=0.0)
    assert priced.trainers == (0, 1, 2)
    measured = decide_group(B, workers, FREE, noise=0.0, measured_gradient_s={(0, 1, 2): 1.0})
    assert measured.everyone.exchange.measured and measured.trainers != (0, 1, 2)


def test_a_worker_that_cannot_hold_one_slice_stands_by_or_is_refused_by_name():
    workers = [cpu("a", 1e-3), cpu("tiny", 1e-3, cap=1)]
    decision = decide_group(B, workers, FREE, noise=0.0, min_slice=2)
    assert decision.standing_by == (1,) and not decision.everyone.feasible
    assert decision.gain == math.inf
    with pytest.raises(AllocationError, match="worker 'tiny' can hold at most 1 samples"):
        decide_group(B, workers, FREE, noise=0.0, min_slice=2, mode="all")
    with pytest.raises(AllocationError, match="caps hold 20 samples in all"):
        decide_group(B, [cpu("a", 1e-3, cap=10), cpu("b", 1e-3, cap=10)], FREE, noise=0.0)


def test_modes_all_and_train_by_name():
    workers = cpu_gpu_workers(feed=4000)
    assert decide_group(1024, workers, STAGED, noise=0.05, mode="all").trainers == (0, 1, 2, 3)
    train = decide_group(1024, workers, STAGED, noise=0.05, mode="train")
    assert train.feeders == () and train.standing_by == (1, 2, 3)
    with pytest.raises(AllocationError, match="group mode 'some'"):
        decide_group(1024, workers, STAGED, noise=0.05, mode="some")  # type: ignore[arg-type]


def test_a_ray_data_pipeline_fed_by_a_cpu_worker():
    # Two trainers of 500/s each, a pipeline delivering 600/s; the CPU worker adds 400 feeding.
    workers = [
        cpu("a", 2e-3, 0.0),
        cpu("b", 2e-3, 0.0),
        cpu("c", 1e-2, 0.0, feed_samples_per_s=400),
    ]
    decision = decide_group(B, workers, FREE, noise=0.02, pipeline_samples_per_s=600)
    assert decision.trainers == (0, 1) and decision.feeders == (2,)
    assert decision.chosen.bound == "compute"
    assert decision.everyone.bound == "pipeline"


def test_beyond_the_exhaustive_size_prefixes_of_the_fastest_first_order():
    n = 11  # 2**11 - 1 distinct sets: more than MAX_EXACT_SETS
    workers = [cpu(f"w{i}", 1e-3 * (1 + i)) for i in range(n)]
    decision = decide_group(B * 4, workers, GLOO, noise=0.05)
    assert not decision.exhaustive and decision.considered == n


def test_interchangeable_workers_are_searched_by_how_many_train():
    workers = [cpu(f"a{i}", 1e-3) for i in range(6)] + [cpu(f"b{i}", 3e-3) for i in range(6)]
    decision = decide_group(B * 4, workers, GLOO, noise=0.05)
    assert decision.exhaustive and decision.considered == 7 * 7 - 1
    assert decision.trainers == tuple(range(12))


# ------------------------------------------------------------------------------------ re-take


def _excluding() -> tuple[list[WorkerPrice], object]:
    workers = [cpu("a", 1e-3), cpu("b", 1e-3), cpu("slow", 2e-2, exchange_delay_s=0.3)]
    return workers, decide_group(B, workers, GLOO, noise=0.05)


def test_retake_when_the_group_runs_below_its_prediction_and_the_worker_comes_back():
    workers, decision = _excluding()
    predicted = decision.chosen.samples_per_s
    assert decision.standing_by == (2,)
    check = check_retake(decision, predicted * 0.5, measured_steps=20)
    assert check.retake and check.ratio == pytest.approx(0.5) and "below it" in check.reason
    # Re-priced: the link was not slow after all; the standing-by worker trains again.
    workers[2] = cpu("slow", 2e-2)
    again = decide_group(B, workers, GLOO, noise=0.05)
    assert again.trainers == (0, 1, 2)


def test_a_group_that_kept_everyone_and_ran_slow_is_repriced_and_stands_the_slow_pair_by():
    """cpu-gpu-shape's seed 2: the window's noise kept every worker (+22 % < the margin); the
    group then ran 26 % below its prediction. Re-priced from its own steps (costs as they
    measured, the exchange as it showed), the re-take stands the slow pair by."""
    fast = cpu("fast", 6.2e-3, 0.02)
    slow = [cpu(f"slow-{i}", 0.25, 0.1, exchange_delay_s=0.3) for i in range(2)]
    workers = [fast, *slow]
    first = decide_group(B, workers, GLOO, noise=0.144)
    assert first.trainers == (0, 1, 2)  # the gain stays inside a 14.4 % noise's margin
    slices = first.chosen.slices
    costs = [w.step for w in workers]
    busy = [[c.time(b)] * 10 for c, b in zip(costs, slices)]  # the workers cost as priced
    predicted_step = B / first.chosen.samples_per_s
    walls = [predicted_step / 0.74] * 10  # the group ran at 0.74x its prediction
    check = check_retake(first, B / walls[0], measured_steps=10)
    assert check.retake and "below it" in check.reason
    repriced = reprice_from_steps(costs, [[b] * 10 for b in slices], busy, walls)
    assert [c.time(b) for c, b in zip(repriced.costs, slices)] == pytest.approx(
        [c.time(b) for c, b in zip(costs, slices)]
    )
    assert repriced.exchange_s == pytest.approx(walls[0] - max(busy[r][0] for r in range(3)))
    again = decide_group(
        B,
        [replace(w, step=c) for w, c in zip(workers, repriced.costs)],
        GLOO,
        noise=0.02,  # ten steps of equal times: the floor
        measured_gradient_s={frozenset({0, 1, 2}): repriced.exchange_s},
    )
    assert again.trainers == (0,) and again.standing_by == (1, 2)
    # What the group measured is what the re-take predicts for it.
    assert again.everyone.samples_per_s == pytest.approx(B / walls[0], rel=0.02)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.05), st.floats(1e-4, 1e-2), st.integers(1, 64)),
        min_size=1,
        max_size=5,
    ),
    st.floats(0.2, 5.0),
    st.floats(0.0, 0.5),
)
def test_repricing_predicts_what_each_worker_measured(workers, factor, extra):
    costs = [CostModel(a, b) for a, b, _ in workers]
    slices = [[n] * 3 for _, _, n in workers]
    busy = [[c.time(n) * factor] * 3 for c, (_, _, n) in zip(costs, workers)]
    walls = [max(t[0] for t in busy) + extra] * 3
    repriced = reprice_from_steps(costs, slices, busy, walls)
    for cost, new, (_, _, n) in zip(costs, repriced.costs, workers):
        assert new.time(n) == pytest.approx(cost.time(n) * factor)
        assert new.alpha * cost.beta == pytest.approx(new.beta * cost.alpha)  # shape kept
    assert repriced.exchange_s == pytest.approx(extra, abs=1e-9)
    # A step shorter than its slowest worker's busy time (timer noise) shows no exchange.
    assert reprice_from_steps(costs, slices, busy, [(walls[0] - extra) / 2]).exchange_s == 0.0


def test_repricing_refuses_what_it_cannot_use():
    with pytest.raises(AllocationError, match="one entry per worker"):
        reprice_from_steps([CostModel(0.0, 1e-3)], [], [], [1.0])
    with pytest.raises(AllocationError, match="at least one measured step time"):
        reprice_from_steps([CostModel(0.0, 1e-3)], [[1]], [[1.0]], [float("nan")])


def test_a_group_within_its_margin_is_repriced_and_acts_only_when_a_verdict_changes():
    """cpu-gpu-shape's seed 2 as measured: the window's noise (21.7 %) gave a 55 % margin, so
    the group running at 0.83x its prediction stayed within it. Re-priced from its own ten
    steps (equal times: the noise floor), the fast worker alone now clears the new margin:
    the verdicts change and the re-take acts. A re-pricing that keeps every verdict does not."""
    fast = cpu("fast", 6.2e-3, 0.02)
    slow = [cpu(f"slow-{i}", 0.25, 0.1, exchange_delay_s=0.3) for i in range(2)]
    workers = [fast, *slow]
    first = decide_group(B, workers, GLOO, noise=0.217)
    assert first.trainers == (0, 1, 2) and first.margin > 0.5
    slices = first.chosen.slices
    costs = [w.step for w in workers]
    busy = [[c.time(b)] * 10 for c, b in zip(costs, slices)]
    walls = [B / first.chosen.samples_per_s / 0.83] * 10
    check = check_retake(first, B / walls[0], measured_steps=10)
    assert not check.retake and check.reprice and "within it" in check.reason
    repriced = reprice_from_steps(costs, [[b] * 10 for b in slices], busy, walls)
    again = decide_group(
        B,
        [replace(w, step=c) for w, c in zip(workers, repriced.costs)],
        GLOO,
        noise=0.02,
        measured_gradient_s={frozenset({0, 1, 2}): repriced.exchange_s},
    )
    assert again.trainers == (0,)
    outcome = settle_retake(check, first, again)
    assert (
        outcome.act
        and "the decision changes" in outcome.reason
        and "[0, 1, 2] -> [0]" in (outcome.reason)
    )
    # The same re-pricing with the first decision's verdicts: nothing to act on.
    assert not settle_retake(check, first, first).act
    # Too few steps or mode all: no re-pricing asked, nothing acts whatever the new verdicts.
    early = check_retake(first, B / walls[0], measured_steps=3)
    assert not early.reprice and not settle_retake(early, first, again).act
    forced = decide_group(B, workers, GLOO, noise=0.217, mode="all")
    settled = check_retake(forced, B / walls[0], measured_steps=10)
    assert not settled.reprice and not settle_retake(settled, forced, again).act
    # A check that asked for a re-take acts even when the verdicts stay.
    below = check_retake(first, B / walls[0] * 0.3, measured_steps=10)
    assert below.retake and settle_retake(below, first, first).act


def test_a_stall_of_one_rank_between_steps_is_not_charged_to_the_exchange():
    """hetero2 (scale 2, `group: train`) as measured: rank 0 evaluates after every third step
    (0.63 s), so its wall is long there and rank 1's is long at the next step (it waits).
    Each step's largest wall (1.7 s in two steps of three) made the exchange look 0.64 s and
    stood the slow worker by; the slowest rank's median wall is the group's period."""
    r0 = [1.30, 1.09 + 0.63, 1.05, 1.05, 1.04 + 0.63, 1.04, 1.04, 1.04 + 0.63, 1.05, 1.06]
    r1 = [1.30, 1.09, 1.05 + 0.63, 1.05, 1.04, 1.04 + 0.63, 1.04, 1.04, 1.05 + 0.63, 1.06]
    assert group_step_s([r0, r1]) == pytest.approx(1.06, abs=0.02)
    assert statistics.median(max(a, b) for a, b in zip(r0, r1)) > 1.6  # the old reading
    costs = [CostModel(0.0, 1.0 / 144), CostModel(0.0, 1.0 / 48)]  # both 1.0 s a step
    busy = [[1.0] * 10, [1.0] * 10]
    repriced = reprice_from_steps(costs, [[144] * 10, [48] * 10], busy, [group_step_s([r0, r1])])
    assert repriced.exchange_s == pytest.approx(0.06, abs=0.02)
    workers = [cpu("fast", 1.0 / 144, 0.0), cpu("slow", 1.0 / 48, 0.0)]
    again = decide_group(
        B,
        [replace(w, step=c) for w, c in zip(workers, repriced.costs)],
        GLOO,
        noise=0.02,
        measured_gradient_s={frozenset({0, 1}): repriced.exchange_s},
    )
    assert again.trainers == (0, 1)
    # A worker that is slow at every step sets the period: its wait is on every rank.
    assert group_step_s([[1.0] * 5, [1.6] * 5]) == pytest.approx(1.6)
    with pytest.raises(AllocationError, match="at least one measured step time"):
        group_step_s([[float("nan")], []])


def _cpu_gpu_shape_window() -> list[WorkerPrice]:
    """cpu-gpu-shape's seed 0 as its passive window measured it (AMD EPYC): the fast worker
    186 x 6.51 ms a step, 0.57 s of it loading (an EMULATED 2.5 ms read per sample); the slow
    pair 3 x 0.39 s, nearly all compute, behind a 0.3 s EMULATED link."""
    fast_step, slow_step = CostModel(0.0, 6.51e-3), CostModel(0.0, 0.39)
    fast_loading = loading_per_sample([186] * 3, [1.21] * 3, [0.64] * 3)
    slow_loading = loading_per_sample([3] * 3, [1.20] * 3, [1.17] * 3)
    assert fast_loading == pytest.approx(0.57 / 186) and slow_loading == pytest.approx(0.01)
    fast = WorkerPrice("fast", fast_step, compute=compute_cost(fast_step, fast_loading))
    slow = [
        WorkerPrice(
            f"slow-{i}",
            slow_step,
            compute=compute_cost(slow_step, slow_loading),
            exchange_delay_s=0.3,
        )
        for i in range(2)
    ]
    return [fast, *slow]


def test_exact_batchnorm_makes_a_loader_bound_worker_pay_its_loading_and_the_slow_compute():
    """Under exact BatchNorm every rank waits at the first BatchNorm layer for the slowest
    rank's data, so the fast worker's loading and the slow pair's compute add up. The group of
    three measured 2.1 s a step; priced as the slowest rank's whole step it was 1.51 s, a gain
    of +21 % for the fast worker alone, inside the window's 31.7 % margin: all three kept,
    13 steps at 0.6x. Priced with the ranks meeting in forward it is 2.01 s: +61 %, the pair
    stands by at the window."""
    workers = _cpu_gpu_shape_window()
    exact = replace(GLOO, batchnorm_layers=4, batchnorm_bytes=8 * (4 * 64 + 1))
    plain = decide_group(B, workers, GLOO, noise=0.137, mode="train")
    assert plain.trainers == (0, 1, 2) and plain.everyone.step_s < 1.6
    synced = decide_group(B, workers, exact, noise=0.137, mode="train")
    assert synced.everyone.step_s == pytest.approx(2.1, rel=0.1)
    assert synced.trainers == (0,) and synced.standing_by == (1, 2)
    assert synced.gain > synced.margin
    # One worker alone meets nobody: its step is its own, whatever the BatchNorm.
    assert synced.chosen.step_s == pytest.approx(workers[0].step.time(B))
    # Where loading is not known apart (compute None), the whole step counts as compute.
    blind = [replace(w, compute=None) for w in workers]
    assert decide_group(B, blind, exact, noise=0.137, mode="train").trainers == (0, 1, 2)


def test_the_loading_of_measured_steps_and_the_compute_it_leaves():
    assert loading_per_sample([10, 20], [1.0, 2.0], [0.5, 1.0]) == pytest.approx(0.05)
    assert loading_per_sample([10], [0.4], [0.5]) == 0.0  # compute above busy: no loading
    assert math.isnan(loading_per_sample([10, 0], [1.0, 1.0], [math.nan, 0.5]))
    step = CostModel(0.01, 0.006)
    compute = compute_cost(step, 0.0025)
    assert compute == CostModel(0.01, 0.0035)
    assert compute_cost(step, math.nan) is None and compute_cost(step, -1.0) is None
    assert compute_cost(step, 1.0).beta == pytest.approx(0.006e-3)  # kept positive


def test_repricing_a_synchronised_group_charges_the_exchange_only_what_is_left():
    """The group of three's 2.1 s period: 0.57 s loading + 1.18 s compute meet in forward,
    so its exchange is 0.35 s, not the 0.9 s left over the slowest rank's busy 1.2 s."""
    costs = [CostModel(0.0, 6.51e-3), CostModel(0.0, 0.39), CostModel(0.0, 0.39)]
    slices = [[186] * 10, [3] * 10, [3] * 10]
    busy = [[1.21] * 10, [1.2] * 10, [1.2] * 10]
    compute = [[0.64] * 10, [1.18] * 10, [1.18] * 10]
    plain = reprice_from_steps(costs, slices, busy, [2.1])
    synced = reprice_from_steps(costs, slices, busy, [2.1], compute_s=compute)
    assert plain.exchange_s == pytest.approx(0.89)
    assert synced.exchange_s == pytest.approx(2.1 - 0.57 - 1.18)
    assert synced.costs == plain.costs


def test_retake_rules():
    _, decision = _excluding()
    predicted = decision.chosen.samples_per_s
    assert not check_retake(decision, predicted, measured_steps=3).retake  # too few steps
    assert not check_retake(decision, predicted * 1.02, measured_steps=20).retake
    assert check_retake(decision, predicted, measured_steps=0, workers_changed=True).retake
    above = check_retake(decision, predicted * 2, measured_steps=20)
    assert above.retake and "above it" in above.reason
    periodic = check_retake(decision, predicted, measured_steps=50, standby_recheck_steps=50)
    assert periodic.retake and "re-priced every 50 steps" in periodic.reason
    forced = decide_group(B, _excluding()[0], GLOO, noise=0.05, mode="all")
    assert not check_retake(forced, 1.0, measured_steps=100).retake


# ---------------------------------------------------------------------------- hypothesis


@st.composite
def worker_prices(
    draw, n: int, *, equal: bool = False, feed: bool = True, links: bool = True
) -> list[WorkerPrice]:
    def one(i: int) -> WorkerPrice:
        alpha = draw(st.floats(0.0, 0.05))
        beta = draw(st.floats(1e-4, 1e-2))
        scale = draw(st.floats(0.2, 1.0))
        separable = draw(st.booleans())
        return WorkerPrice(
            f"w{i}",
            step=CostModel(alpha, beta),
            compute=CostModel(alpha * scale, beta * scale) if separable else None,
            device=draw(st.sampled_from(["cpu", "cuda"])),
            cap=draw(st.one_of(st.none(), st.integers(1, 400))),
            feed_samples_per_s=draw(st.floats(0.0, 2000.0)) if feed else 0.0,
            exchange_delay_s=draw(st.sampled_from([0.0, 0.0, 0.01, 0.2])) if links else 0.0,
        )

    if equal:
        w = one(0)
        return [
            WorkerPrice(
                f"w{i}",
                w.step,
                w.compute,
                w.device,
                w.cap,
                w.feed_samples_per_s,
                w.exchange_delay_s,
            )
            for i in range(n)
        ]
    return [one(i) for i in range(n)]


exchange_prices = st.builds(
    ExchangePrice,
    gradient_bytes=st.floats(0.0, 1e8),
    gloo=st.builds(LinkCost, st.floats(0.0, 1e-2), st.floats(1e7, 1e10)),
    nccl=st.one_of(st.none(), st.builds(LinkCost, st.floats(0.0, 1e-4), st.floats(1e9, 1e12))),
    gradient_calls=st.integers(1, 3),
    batchnorm_layers=st.integers(0, 5),
    batchnorm_bytes=st.floats(0.0, 1e4),
    host_bytes_per_s=st.floats(1e8, 1e11),
    overlap=st.floats(0.0, 1.0),
)

settings_ = settings(max_examples=100, deadline=None)


def _decide(data, *, noise=None, mode="auto"):
    n = data.draw(st.integers(1, 5), label="n")
    workers = data.draw(worker_prices(n), label="workers")
    exchange = data.draw(exchange_prices, label="exchange")
    total = data.draw(st.integers(n, 512), label="total")
    min_slice = data.draw(st.integers(1, 3), label="min_slice")
    quantum = data.draw(st.sampled_from([1, 1, 4]), label="quantum")
    pipeline = data.draw(st.sampled_from([math.inf, math.inf, 300.0, 5000.0]), label="pipeline")
    if noise is None:
        noise = data.draw(st.floats(0.0, 0.3), label="noise")
    try:
        decision = decide_group(
            total,
            workers,
            exchange,
            noise=noise,
            mode=mode,
            min_slice=min_slice,
            quantum=quantum,
            pipeline_samples_per_s=pipeline,
        )
    except AllocationError:
        assume(False)
    return decision, workers, exchange, total, min_slice, quantum


@settings_
@given(data=st.data())
def test_never_predicts_below_the_best_it_considered(data):
    decision, *_ = _decide(data)
    best, chosen = decision.best.samples_per_s, decision.chosen.samples_per_s
    assert best >= chosen * (1 - 1e-12)  # best is the best
    assert chosen * (1 + decision.margin) >= best * (1 - 1e-12)


@settings_
@given(data=st.data())
def test_without_noise_the_decision_is_the_best_considered(data):
    decision, *_ = _decide(data, noise=0.0)
    assert decision.chosen.samples_per_s == decision.best.samples_per_s


@settings_
@given(data=st.data())
def test_the_best_is_the_best_subset(data):
    """An independent oracle: every set of trainers, no feeding, no pipeline."""
    n = data.draw(st.integers(1, 5), label="n")
    workers = data.draw(worker_prices(n, feed=False), label="workers")
    exchange = data.draw(exchange_prices, label="exchange")
    total = data.draw(st.integers(n, 512), label="total")
    try:
        decision = decide_group(total, workers, exchange, noise=0.0, mode="train")
    except AllocationError:
        assume(False)
    rates = []
    for k in range(1, n + 1):
        for group in combinations(range(n), k):
            members = [workers[r] for r in group]
            try:
                slices = allocate(total, [w.step for w in members], caps=[w.cap for w in members])
            except AllocationError:
                continue
            step = makespan(slices, [w.step for w in members])
            if k > 1 and exchange.batchnorm_layers > 0:  # the ranks meet in forward
                loads = [
                    w.step.time(b) - w.compute.time(b) if w.compute is not None else 0.0
                    for w, b in zip(members, slices)
                    if b > 0
                ]
                computes = [
                    w.compute.time(b) if w.compute is not None else w.step.time(b)
                    for w, b in zip(members, slices)
                    if b > 0
                ]
                step = max(step, max(loads) + max(computes))
            rates.append(total / (step + price_exchange(members, exchange).exposed_s))
    assert decision.best.samples_per_s == pytest.approx(max(rates), rel=1e-12)
    assert decision.chosen.samples_per_s == pytest.approx(max(rates), rel=1e-12)


@settings_
@given(data=st.data())
def test_a_gain_inside_the_margin_never_excludes(data):
    decision, *_ = _decide(data)
    everyone = decision.everyone.samples_per_s
    if decision.best.samples_per_s <= everyone * (1 + decision.margin):
        assert all(w.verdict == "train" for w in decision.workers)
    if decision.trainers != tuple(range(len(decision.workers))) or decision.feeders:
        assert decision.chosen.samples_per_s > everyone * (1 + decision.margin)


@settings_
@given(data=st.data(), noise=st.floats(0.01, 0.3))
def test_the_noise_margin_is_honoured_under_perturbed_prices(data, noise):
    """Where every worker truly belongs in the group, prices off by up to ±noise never
    leave one out: the decision's margin covers two predictions' errors."""
    n = data.draw(st.integers(2, 4), label="n")
    workers = data.draw(worker_prices(n, links=data.draw(st.booleans())), label="workers")
    exchange = data.draw(st.one_of(st.just(FREE), exchange_prices), label="exchange")
    total = data.draw(st.integers(n, 512), label="total")
    try:
        truth = decide_group(total, workers, exchange, noise=0.0)
    except AllocationError:
        assume(False)
    assume(truth.everyone.feasible)
    assume(truth.everyone.samples_per_s >= truth.best.samples_per_s)
    factors = data.draw(
        st.lists(st.floats(1 - noise * 0.999, 1 + noise * 0.999), min_size=n, max_size=n)
    )
    feeds = data.draw(
        st.lists(
            st.floats(1 / (1 + noise * 0.999), 1 / (1 - noise * 0.999)), min_size=n, max_size=n
        )
    )

    def off(w: WorkerPrice, f: float, g: float) -> WorkerPrice:
        scale = lambda c: None if c is None else CostModel(c.alpha * f, c.beta * f)
        return WorkerPrice(
            w.name,
            scale(w.step),
            scale(w.compute),
            w.device,
            w.cap,
            w.feed_samples_per_s * g,
            w.exchange_delay_s,
        )

    seen = [off(w, f, g) for w, f, g in zip(workers, factors, feeds)]
    decision = decide_group(total, seen, exchange, noise=noise)
    assert decision.trainers == tuple(range(n)) and decision.feeders == ()


@pytest.mark.parametrize("noise", [0.02, 0.1, 0.3])
def test_a_true_tie_seen_through_the_worst_noise_keeps_both_workers(noise):
    """Two equal workers whose exchange equals what the second saves (a true tie between
    the pair and one alone), priced at the worst corners of ``±noise``: one seen faster, the
    other slower. A margin of ``noise`` alone would leave the second out; the decision's
    (two predictions' errors) keeps it."""
    beta = 1e-3
    tie = ExchangePrice(gradient_bytes=0.0, gloo=LinkCost(beta / 2, math.inf))
    true = [cpu("a", beta, 0.0), cpu("b", beta, 0.0)]
    truth = decide_group(2, true, tie, noise=0.0)
    assert truth.everyone.samples_per_s == pytest.approx(truth.best.samples_per_s)
    seen = [cpu("a", beta * (1 - noise * 0.999), 0.0), cpu("b", beta * (1 + noise * 0.999), 0.0)]
    kept = decide_group(2, seen, tie, noise=noise)
    assert kept.trainers == (0, 1)
    gain = kept.best.samples_per_s / kept.everyone.samples_per_s - 1
    assert gain > noise  # the gain a one-noise margin would have believed


@settings_
@given(data=st.data())
def test_all_equal_workers_are_never_excluded(data):
    n = data.draw(st.integers(1, 6), label="n")
    workers = data.draw(worker_prices(n, equal=True, feed=False, links=False), label="workers")
    quantum = data.draw(st.sampled_from([1, 4]), label="quantum")
    min_slice = data.draw(st.integers(1, 3), label="min_slice")
    total = data.draw(st.integers(n * max(min_slice, quantum), 600), label="total")
    assume(workers[0].cap is None or workers[0].cap * n >= total)
    try:
        decision = decide_group(
            total,
            workers,
            FREE,
            noise=data.draw(st.floats(0.0, 0.3)),
            min_slice=min_slice,
            quantum=quantum,
        )
    except AllocationError:
        assume(False)
    assert decision.trainers == tuple(range(n))


@settings_
@given(data=st.data(), mode=st.sampled_from(["auto", "train", "all"]))
def test_no_trainer_ever_gets_an_empty_slice(data, mode):
    decision, workers, _, total, min_slice, _ = _decide(data, mode=mode)
    for prediction in (decision.chosen, decision.best):
        assert sum(prediction.slices) == total
        for rank, size in enumerate(prediction.slices):
            if rank in prediction.trainers:
                assert size >= max(1, min_slice)
                assert workers[rank].cap is None or size <= workers[rank].cap
            else:
                assert size == 0
    assert {w.index for w in decision.workers if w.verdict == "train"} == set(decision.trainers)
    assert all(w.slice == decision.chosen.slices[w.index] for w in decision.workers)
    if mode == "all":
        assert decision.trainers == tuple(range(len(workers)))
    if mode != "auto":
        assert decision.feeders == ()


def test_noise_margin_bounds_the_ratio_of_two_predictions():
    assert noise_margin(0.0) == 0.0
    assert noise_margin(0.1) == pytest.approx(1.1 / 0.9 - 1)
    with pytest.raises(AllocationError, match="noise"):
        noise_margin(1.0)


@settings_
@given(data=st.data())
def test_meeting_in_forward_never_predicts_a_shorter_step(data):
    """``max load + max compute`` is at least every rank's own step: synchronising the ranks
    can only lengthen the predicted step, and fed ranks pay compute only."""
    n = data.draw(st.integers(1, 5), label="n")
    workers = data.draw(worker_prices(n), label="workers")
    slices = data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n), label="slices")
    synced = synchronised_makespan(slices, workers)
    assert synced >= makespan(slices, [w.step for w in workers]) * (1 - 1e-12)
    fed = synchronised_makespan(slices, workers, fed=True)
    assert fed == pytest.approx(makespan(slices, [w.fed_cost() for w in workers]))
