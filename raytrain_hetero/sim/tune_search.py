"""Simulated Tune searches on a mixed cluster: ASHA over many trials, four ways to give workers.

Input: per job configuration its throughput on one worker of each type (Gavel's table, see
``benchmarks/data/gavel``), turned into the project's affine cost models per model family and
type (:func:`family_costs`: ``t(b) = alpha + beta * b`` fitted over the family's batch sizes
with :func:`~raytrain_hetero.core.allocation.fit_cost_model`) and a per-step gradient exchange
(:func:`family_sync`, from the table's multi-worker entries). A trial is one configuration;
its global batch is its batch size, carved over whatever workers it holds.

Policies (all under the same ASHA, Ray Tune's ``AsyncHyperBandScheduler`` rules):

* ``fifo``: Tune's default: every trial asks for one GPU, trials start in order on the first
  free GPU (any type) and keep it; CPU nodes idle.
* ``distribute``: Ray's ``ResourceChangingScheduler`` + ``DistributeResources``: trials start
  on one GPU; at every result a trial grows to its even share of the GPUs (the extra GPUs dealt
  round-robin over the live trials, at most what is free) or shrinks to it, restarting; the
  GPUs it gets are whichever are free ("all bundles are equal"), and Ray Train splits the batch
  evenly over them (the step waits for the slowest).
* ``ours``: :func:`~raytrain_hetero.core.trial_allocation.decide_trial_allocation` at every
  trial end or stop, start and ASHA rung; trials carve the batch by measured speed and may
  span types and the CPU nodes.
The bounds of the work ``ours`` did are :mod:`raytrain_hetero.sim.tune_bounds`.

Pure: numpy and :mod:`raytrain_hetero.core`; deterministic per seed.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from raytrain_hetero.core.allocation import CostModel, fit_cost_model
from raytrain_hetero.core.move_pricing import MovePrice
from raytrain_hetero.core.trial_allocation import (
    ClusterNode,
    TrialDemand,
    WorkerSlot,
    WorkerType,
    asha_expected_epochs,
    cluster_slots,
    decide_trial_allocation,
)

__all__ = [
    "POLICIES",
    "SearchResult",
    "TrialSpec",
    "TuneSimConfig",
    "family_costs",
    "family_sync",
    "make_cluster",
    "make_trials",
    "simulate_search",
]

POLICIES: tuple[str, ...] = ("fifo", "distribute", "ours")

GPU_TYPES: tuple[str, ...] = ("v100", "p100", "k80")

#: ASSUMPTION (no published figure in the table): a CPU node's worker runs at this fraction of
#: a K80's per-sample speed, with the K80's fixed per-step cost.
CPU_FRACTION_OF_K80 = 0.2


@dataclass(frozen=True)
class TuneSimConfig:
    """One simulated search.

    Attributes:
        trials: Trials in the search.
        gpu_nodes: Nodes per GPU type (v100, p100, k80).
        gpus_per_node: GPUs per GPU node.
        cpu_nodes: CPU-only nodes (one worker each).
        max_t: ASHA's max epochs; grace_period and reduction_factor as Tune's.
        epoch_v100_s: An epoch's samples: what one V100 processes in this many seconds
            (every configuration; the table gives speeds, not dataset sizes).
        restart_s: Seconds a trial loses when its workers change (and at its start).
        contention: ``ours``' charge for what a restart takes from the other trials (a
            fraction of their speed while it runs; the simulated trials do not slow down).
        step_error: ``ours``' error margin on a moved trial's predicted run (relative).
        restart_error: ``ours``' error margin on a restart (relative).
        families: Model families the trials draw from (None: every family in the table).
        seed: Trial draw, learning curves and node order.
    """

    trials: int = 64
    gpu_nodes: int = 4
    gpus_per_node: int = 4
    cpu_nodes: int = 8
    max_t: int = 27
    grace_period: int = 1
    reduction_factor: float = 3.0
    epoch_v100_s: float = 120.0
    restart_s: float = 30.0
    contention: float = 0.0
    step_error: float = 0.0
    restart_error: float = 0.0
    families: tuple[str, ...] | None = None
    seed: int = 0


@dataclass(frozen=True)
class TrialSpec:
    """One simulated trial: its configuration, model and learning curve."""

    trial_id: str
    config: str
    costs: Mapping[str, CostModel]
    global_batch: int
    sync_s: float
    epoch_samples: float
    quality: float
    noise: tuple[float, ...] = field(default=())

    def metric(self, epoch: int) -> float:
        """Validation score after ``epoch`` epochs (higher is better; depends on the trial only)."""
        return self.quality * (1.0 - math.exp(-epoch / 4.0)) + self.noise[epoch - 1]


@dataclass(frozen=True)
class SearchResult:
    """What one policy achieved.

    Attributes:
        policy: fifo, distribute or ours.
        makespan_s: Time until the last trial ended.
        mean_completion_s: Mean over trials of the time each ended (from the search's start).
        epochs_run: Epochs run per trial, in trial order.
        samples_run: Samples processed per trial.
        rung_counts: Trials that reached each rung.
        restarts: Worker changes of running trials (starts not counted).
        decisions: Allocation decisions (ours).
        decision_s_max: Slowest decision (s).
        decision_s_median: Median decision (s).
        best_trial: The trial with the best final score.
    """

    policy: str
    makespan_s: float
    mean_completion_s: float
    epochs_run: tuple[int, ...]
    samples_run: tuple[float, ...]
    rung_counts: tuple[tuple[int, int], ...]
    restarts: int
    decisions: int = 0
    decision_s_max: float = 0.0
    decision_s_median: float = 0.0
    best_trial: str = ""


# ----------------------------------------------------------------------------- inputs

_BATCH = re.compile(r"\(batch size (\d+)\)")


def _family_and_batch(config: str) -> tuple[str, int]:
    match = _BATCH.search(config)
    if match is None:
        return config, 1  # A3C, CycleGAN: the table gives no batch; one step = one unit
    return config[: match.start()].strip(), int(match.group(1))


def family_costs(
    table: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, dict[str, CostModel]]:
    """Per model family and GPU type the affine step cost fitted over the family's batch sizes
    (single-worker entries); a family with one batch size gets a constant-speed model."""
    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for config, scales in table.items():
        family, batch = _family_and_batch(config)
        for gpu, steps_per_s in scales.get("1", {}).items():
            if steps_per_s > 0:
                points.setdefault(family, {}).setdefault(gpu, []).append((batch, 1 / steps_per_s))
    out: dict[str, dict[str, CostModel]] = {}
    for family, by_gpu in points.items():
        out[family] = {}
        for gpu, pts in by_gpu.items():
            sizes = [b for b, _ in pts]
            if len(set(sizes)) >= 2:
                out[family][gpu] = fit_cost_model(sizes, [s for _, s in pts])
            else:
                out[family][gpu] = CostModel(0.0, pts[0][1] / pts[0][0])
    return out


def family_sync(table: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """Per model family the seconds of one full gradient exchange: from each multi-worker
    entry (``k`` workers, ``steps/s`` summed over them) the extra step time
    ``k / thr_k - 1 / thr_1`` over the ring's ``2 (k - 1) / k``; the median over the family's
    entries (>= 0). A family without multi-worker entries gets the median ratio of exchange to
    one V100 step of the others."""
    per_family: dict[str, list[float]] = {}
    v100_step: dict[str, float] = {}
    for config, scales in table.items():
        family, _ = _family_and_batch(config)
        one = scales.get("1", {})
        if one.get("v100", 0) > 0:
            v100_step.setdefault(family, 1 / one["v100"])
        for scale, by_gpu in scales.items():
            k = int(scale)
            if k < 2:
                continue
            for gpu, thr in by_gpu.items():
                if thr > 0 and one.get(gpu, 0) > 0:
                    extra = k / thr - 1 / one[gpu]
                    per_family.setdefault(family, []).append(max(0.0, extra) * k / (2 * (k - 1)))
    sync = {f: statistics.median(v) for f, v in per_family.items()}
    ratios = [sync[f] / v100_step[f] for f in sync if f in v100_step]
    fallback = statistics.median(ratios) if ratios else 0.0
    for family, step in v100_step.items():
        sync.setdefault(family, fallback * step)
    return sync


def make_trials(
    table: Mapping[str, Mapping[str, Mapping[str, float]]], cfg: TuneSimConfig
) -> list[TrialSpec]:
    """The search's trials: configurations drawn with replacement from the table (the
    search space holds the model and its batch size), with seeded learning curves."""
    rng = np.random.default_rng(cfg.seed)
    costs = family_costs(table)
    sync = family_sync(table)
    configs = sorted(
        c for c in table if cfg.families is None or _family_and_batch(c)[0] in cfg.families
    )
    trials = []
    for j in range(cfg.trials):
        config = configs[int(rng.integers(len(configs)))]
        family, batch = _family_and_batch(config)
        model = dict(costs[family])
        k80 = model["k80"]
        model["cpu"] = CostModel(k80.alpha, k80.beta / CPU_FRACTION_OF_K80)
        v100_rate = batch / model["v100"].time(batch)
        trials.append(
            TrialSpec(
                trial_id=f"trial_{j:03d}",
                config=config,
                costs=model,
                global_batch=batch,
                sync_s=sync[family],
                epoch_samples=v100_rate * cfg.epoch_v100_s,
                quality=float(rng.uniform(0.5, 1.0)),
                noise=tuple(float(x) for x in rng.normal(0.0, 0.01, cfg.max_t)),
            )
        )
    return trials


def make_cluster(cfg: TuneSimConfig) -> tuple[tuple[WorkerSlot, ...], dict[str, str]]:
    """The cluster's worker slots (node ids in a seeded order, as Ray lists nodes) and each
    slot's type."""
    types = [WorkerType(g, {"GPU": 1}, {"accelerator": g}) for g in GPU_TYPES]
    types.append(WorkerType("cpu", {"CPU": 32}, {"accelerator": "none"}))
    rng = np.random.default_rng(cfg.seed + 1)
    names = [(g, i) for g in GPU_TYPES for i in range(cfg.gpu_nodes)]
    names += [("none", i) for i in range(cfg.cpu_nodes)]
    order = rng.permutation(len(names))
    nodes = []
    for rank, index in enumerate(order):
        kind, _ = names[int(index)]
        resources = (
            {"CPU": 32.0, "GPU": float(cfg.gpus_per_node)} if kind != "none" else {"CPU": 32.0}
        )
        nodes.append(ClusterNode(f"node{rank:03d}", resources, {"accelerator": kind}))
    slots, _ = cluster_slots(nodes, types)
    return slots, {s.slot_id: s.worker_type for s in slots}


# ----------------------------------------------------------------------------- ASHA


class _Asha:
    """Ray Tune's ``AsyncHyperBandScheduler`` (one bracket): rungs at ``grace * eta**k``; at
    its first result at or past a rung a trial stops if its score is below the
    ``(1 - 1/eta)`` percentile of the scores recorded there before it; at ``max_t`` it ends."""

    def __init__(self, grace: int, max_t: int, eta: float) -> None:
        count = int(math.log(max_t / grace) / math.log(eta) + 1)
        self.eta = eta
        self.rungs = [grace * eta**k for k in range(count)]
        self.recorded: dict[float, dict[str, float]] = {r: {} for r in self.rungs}
        self.max_t = max_t

    def on_result(self, trial_id: str, epoch: int, score: float) -> bool:
        """True: the trial continues."""
        keep = True
        for milestone in sorted(self.rungs, reverse=True):
            recorded = self.recorded[milestone]
            if epoch < milestone or trial_id in recorded:
                continue
            if recorded:
                cutoff = float(np.nanpercentile(list(recorded.values()), (1 - 1 / self.eta) * 100))
                keep = score >= cutoff
            recorded[trial_id] = score
            break
        return keep and epoch < self.max_t

    def is_rung(self, epoch: int) -> bool:
        return any(epoch >= r > epoch - 1 for r in self.rungs) or epoch >= self.max_t


# ----------------------------------------------------------------------------- the loop


@dataclass
class _Live:
    spec: TrialSpec
    slots: tuple[str, ...] = ()
    rate: float = 0.0  # samples/s on its slots
    resume_at: float = 0.0  # training resumes (after a restart) at this time
    samples: float = 0.0  # within the current epoch
    epochs: int = 0


def _even_split_step(spec: TrialSpec, types: Sequence[str]) -> float:
    """Ray Train's even split: each of N workers gets B/N; the step waits for the slowest."""
    n = len(types)
    share = spec.global_batch / n
    compute = max(spec.costs[t].time(share) for t in types)
    return compute + spec.sync_s * 2.0 * (n - 1) / n


def simulate_search(
    table: Mapping[str, Mapping[str, Mapping[str, float]]],
    cfg: TuneSimConfig,
    policy: str,
) -> SearchResult:
    """Run the search under ``policy`` (one of :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    specs = make_trials(table, cfg)
    slots, slot_type = make_cluster(cfg)
    gpu_slots = [s.slot_id for s in slots if s.worker_type != "cpu"]
    usable = gpu_slots if policy != "ours" else [s.slot_id for s in slots]
    asha = _Asha(cfg.grace_period, cfg.max_t, cfg.reduction_factor)
    price = MovePrice(cfg.contention, cfg.step_error, cfg.restart_error)
    pending = list(specs)
    live: dict[str, _Live] = {}
    ended: dict[str, float] = {}
    epochs_run = {s.trial_id: 0 for s in specs}
    samples_run = {s.trial_id: 0.0 for s in specs}
    rung_counts: dict[int, int] = {}
    restarts = 0
    decision_times: list[float] = []
    now = 0.0

    def free_slots() -> list[str]:
        held = {sid for t in live.values() for sid in t.slots}
        return [sid for sid in usable if sid not in held]

    def set_slots(t: _Live, new: tuple[str, ...], step_s: float) -> None:
        nonlocal restarts
        if t.slots and set(new) != set(t.slots):
            restarts += 1
        if set(new) != set(t.slots):
            t.resume_at = now + cfg.restart_s
        t.slots = new
        t.rate = t.spec.global_batch / step_s

    def counts_of(sids: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for sid in sids:
            out[slot_type[sid]] = out.get(slot_type[sid], 0) + 1
        return out

    def demand(t: _Live) -> TrialDemand:
        left_epochs = _expected_left(t.epochs, cfg) - t.samples / t.spec.epoch_samples
        return TrialDemand(
            trial_id=t.spec.trial_id,
            costs=t.spec.costs,
            global_batch=t.spec.global_batch,
            remaining_samples=max(0.0, left_epochs * t.spec.epoch_samples),
            sync_s=t.spec.sync_s,
            restart_s=cfg.restart_s,
            current=t.slots,
        )

    def reallocate() -> None:
        # offer the allocator the next pending trials (as many as there are slots left);
        # those it finds no fast enough worker for stay pending, in order
        offered = pending[: max(0, len(usable) - len(live))]
        del pending[: len(offered)]
        for spec in offered:
            live[spec.trial_id] = _Live(spec)
        if not live:
            return
        ids = sorted(live)
        started = time.perf_counter()
        decision = decide_trial_allocation(slots, [demand(live[i]) for i in ids], price=price)
        decision_times.append(time.perf_counter() - started)
        waiting = set(decision.waiting)
        pending[:0] = [spec for spec in offered if spec.trial_id in waiting]
        for trial_id in waiting:
            del live[trial_id]
        for a in decision.assignments:
            t = live[a.trial_id]
            if a.changed or not t.slots:
                set_slots(t, a.slots, a.step_s)

    def start_fifo() -> None:
        for sid in free_slots():
            if not pending:
                return
            spec = pending.pop(0)
            t = _Live(spec)
            live[spec.trial_id] = t
            set_slots(t, (sid,), spec.costs[slot_type[sid]].time(spec.global_batch))

    def distribute(t: _Live) -> None:
        live_count = len(live) + len(pending)  # Tune's live trials include pending ones
        extra = len(gpu_slots) - live_count
        upper = 1 + (math.ceil(extra / live_count) if extra > 0 else 0)
        free = free_slots()
        target = min(upper, len(t.slots) + len(free))
        if target == len(t.slots):
            return
        pool = sorted([*t.slots, *free], key=usable.index)  # a new group, placed anew
        new = tuple(pool[:target])
        set_slots(t, new, _even_split_step(t.spec, [slot_type[s] for s in new]))

    if policy == "ours":
        reallocate()
    else:
        start_fifo()
    for _ in range(100_000):
        if not live:
            break

        # next epoch boundary of any running trial
        def finish_time(t: _Live, now: float = now) -> float:
            return max(now, t.resume_at) + (t.spec.epoch_samples - t.samples) / t.rate

        tid = min(live, key=lambda i: (finish_time(live[i]), i))
        until = finish_time(live[tid])
        for t in live.values():
            run = max(0.0, until - max(now, t.resume_at))
            done = min(t.spec.epoch_samples - t.samples, run * t.rate)
            t.samples += done
            samples_run[t.spec.trial_id] += done
        now = until
        t = live[tid]
        t.samples = 0.0
        t.epochs += 1
        epochs_run[tid] = t.epochs
        at_rung = asha.is_rung(t.epochs)
        if at_rung:
            rung_counts[t.epochs] = rung_counts.get(t.epochs, 0) + 1
        keep = asha.on_result(tid, t.epochs, t.spec.metric(t.epochs))
        if not keep:
            del live[tid]
            ended[tid] = now
        if policy == "fifo":
            if not keep:
                start_fifo()
        elif policy == "distribute":
            if not keep:
                start_fifo()
            elif tid in live:
                distribute(live[tid])
        elif at_rung:
            reallocate()
    completions = list(ended.values())
    best = max(
        (s for s in specs if epochs_run[s.trial_id] > 0),
        key=lambda s: (s.metric(epochs_run[s.trial_id]), s.trial_id),
    )
    return SearchResult(
        policy=policy,
        makespan_s=max(completions),
        mean_completion_s=sum(completions) / len(completions),
        epochs_run=tuple(epochs_run[s.trial_id] for s in specs),
        samples_run=tuple(samples_run[s.trial_id] for s in specs),
        rung_counts=tuple(sorted(rung_counts.items())),
        restarts=restarts,
        decisions=len(decision_times),
        decision_s_max=max(decision_times, default=0.0),
        decision_s_median=statistics.median(decision_times) if decision_times else 0.0,
        best_trial=best.trial_id,
    )


def _expected_left(done: int, cfg: TuneSimConfig) -> float:
    return asha_expected_epochs(done, cfg.max_t, cfg.grace_period, cfg.reduction_factor)
