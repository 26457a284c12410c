"""One decision per worker group: each worker trains, feeds, or stands by.

Replaces admission (:mod:`raytrain_hetero.core.admission`: leave out a worker that costs more
than it adds) and roles (once ``core/roles.py``: a CPU worker feeds instead of
training) by one pure decision, for map-style datasets and Ray Data alike. The workers' prices,
the group's exchange and the noise are :mod:`raytrain_hetero.core.group_price`'s.

**The prediction.** For trainers T and feeders F (the others stand by), a global batch of B::

    steps(T)   = B / (makespan(allocate(B, loader-bound costs of T)) + exchange(T))
    compute(T) = B / (makespan(allocate(B, compute costs of T)) + exchange(T))
    samples/s(T, F) = min(compute(T), min(steps(T), pipeline) + sum of feed_k over F)

``allocate`` is the plans' own makespan-minimising carving (caps, minimum slice, ghost
BatchNorm's whole groups), its makespan the slowest trainer's step, or, for two or more
trainers under exact BatchNorm (``exchange.batchnorm_layers > 0``), the slowest loading plus
the slowest compute (:func:`~raytrain_hetero.core.group_price.synchronised_makespan`: the
ranks meet in forward); ``exchange`` the group's priced exposed exchange (its gradient
all-reduce measured where given);
``pipeline`` a shared input pipeline's delivery (Ray Data; ``inf`` for map-style datasets,
whose ranks load their own slices, data wait inside their loader-bound costs); ``feed_k``
what worker k's loading adds when it feeds. Feeding lifts the trainers from their loader-bound
rate toward their compute rate; standing by costs and adds nothing.

**The search.** Every non-empty set of trainers, up to interchangeable workers (identical
prices: only how many of them train matters), while there are at most :data:`MAX_EXACT_SETS`
such sets; beyond, the prefixes of the fastest-first order. Groups with a measured gradient
all-reduce are candidates too. Each set is tried with no feeders and with the fewest feeders
(largest feed first) that reach its highest prediction. *best* is the highest prediction
considered; *everyone* is the stock choice (every worker trains, nobody feeds).

**The rule.** With ``margin = noise_margin(noise)``: a candidate is *eligible* when it beats
*everyone* by more than the margin and is within the margin of *best*. The decision takes
the eligible candidate that changes fewest workers (fewest not training, then fewest
feeding, then the highest prediction); with none eligible, every worker trains. Hence a
worker is left out or moved to feeding only when the predicted gain exceeds the margin, a gain
inside the margin never excludes anyone, and the decision never predicts below the best
candidate it considered by more than the margin (with ``noise = 0``: never below it). A
trainer always gets a slice of at least ``max(1, min_slice)``: roles never empty a rank.

:func:`raytrain_hetero.core.group_retake.check_retake` compares the chosen group's measured
samples/s with the prediction and says when to decide again (a standing-by worker is then a
candidate again: it can come back).

Pure: standard library and numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import product
from typing import Any, Literal

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.group_price import (
    ExchangeCost,
    ExchangePrice,
    WorkerPrice,
    noise_margin,
    price_exchange,
    synchronised_makespan,
)
from raytrain_hetero.errors import AllocationError

__all__ = [
    "MAX_EXACT_SETS",
    "MODES",
    "GroupDecision",
    "GroupMode",
    "GroupPrediction",
    "Verdict",
    "WorkerVerdict",
    "decide_group",
]

#: Distinct trainer sets searched exhaustively (10 distinct workers: 1023); beyond, prefixes.
MAX_EXACT_SETS = 1023

GroupMode = Literal["auto", "train", "all"]
Verdict = Literal["train", "feed", "stand_by"]

#: Per mode: (a worker may stand by, a worker may feed). ``auto``: train, feed or stand by;
#: ``train``: train or stand by (the old ``admission: auto`` + ``roles: train``); ``all``:
#: every worker trains (``admission: all`` + ``roles: train``), priced all the same.
MODES: dict[str, tuple[bool, bool]] = {
    "auto": (True, True),
    "train": (True, False),
    "all": (False, False),
}

_REL = 1e-12  # float slack of "reaches the same prediction"


@dataclass(frozen=True)
class GroupPrediction:
    """The predicted step of one assignment (trainers, feeders; the others stand by).

    Attributes:
        trainers: Worker indices that train, ascending.
        feeders: Worker indices that feed, ascending.
        slices: Per worker (all of them, in order) its samples per step; 0 unless it trains.
        exchange: The trainers' priced (or measured) exchanges.
        step_s: Predicted seconds per step (``inf`` when no plan of B fits the trainers).
        samples_per_s: Predicted samples/s (0 when no plan fits).
        bound: What limits it: ``"loading"`` (the trainers' loader-bound steps, plus what
            the feeders deliver), ``"compute"`` (the trainers' compute: loading is fed in
            full), ``"pipeline"`` (the shared input pipeline, plus its feeders) or
            ``"infeasible"``.
    """

    trainers: tuple[int, ...]
    feeders: tuple[int, ...]
    slices: tuple[int, ...]
    exchange: ExchangeCost
    step_s: float
    samples_per_s: float
    bound: Literal["loading", "compute", "pipeline", "infeasible"]

    @property
    def feasible(self) -> bool:
        """Whether a plan of B samples fits the trainers."""
        return self.samples_per_s > 0


@dataclass(frozen=True)
class WorkerVerdict:
    """What one worker does, and why.

    Attributes:
        index: Its index in the decision's inputs (its rank in the measured group).
        worker: Its name.
        verdict: ``"train"``, ``"feed"`` or ``"stand_by"``.
        slice: Samples per step in the chosen plan (0 unless it trains).
        alone_samples_per_s: Its loader-bound samples/s on the whole batch alone.
        feed_samples_per_s: What it adds feeding (its input).
        alternative_samples_per_s: The group's prediction with this worker's verdict changed
            (a trainer left out; a feeder or stand-by training instead); 0: no plan fits.
        reason: One line with the numbers.
    """

    index: int
    worker: str
    verdict: Verdict
    slice: int
    alone_samples_per_s: float
    feed_samples_per_s: float
    alternative_samples_per_s: float
    reason: str


@dataclass(frozen=True)
class GroupDecision:
    """Which workers train, feed or stand by, with the predictions behind it.

    Attributes:
        mode: ``auto``, ``train`` or ``all`` (:data:`MODES`).
        global_batch_size: B.
        workers: One verdict per worker, in input order.
        chosen: The chosen assignment's prediction.
        best: The best prediction considered (the decision is within ``margin`` of it).
        everyone: Every worker training, nobody feeding (the stock choice).
        noise: The prediction's relative error estimate (an input).
        margin: The relative gain a change must predict (:func:`noise_margin` of ``noise``).
        gain: ``chosen / everyone - 1`` (``inf`` when no plan fits every worker).
        considered: Assignments predicted.
        exhaustive: Whether every set of trainers was considered (up to interchangeable
            workers).
        preference: Worker indices fastest first (loader-bound, whole batch alone).
        pipeline_samples_per_s: The shared input pipeline's measured delivery with every
            worker training (an input; ``inf``: each rank loads its own slices).
    """

    mode: str
    global_batch_size: int
    workers: tuple[WorkerVerdict, ...]
    chosen: GroupPrediction
    best: GroupPrediction
    everyone: GroupPrediction
    noise: float
    margin: float
    gain: float
    considered: int
    exhaustive: bool
    preference: tuple[int, ...]
    pipeline_samples_per_s: float = math.inf

    @property
    def trainers(self) -> tuple[int, ...]:
        """Indices of the workers that train."""
        return self.chosen.trainers

    @property
    def feeders(self) -> tuple[int, ...]:
        """Indices of the workers that feed."""
        return self.chosen.feeders

    @property
    def standing_by(self) -> tuple[int, ...]:
        """Indices of the workers that stand by."""
        return tuple(w.index for w in self.workers if w.verdict == "stand_by")

    def summary(self) -> str:
        """One line for the log, the progress view and ``summary.json``."""
        names = {
            v: ", ".join(w.worker for w in self.workers if w.verdict == v) or "-"
            for v in ("train", "feed", "stand_by")
        }
        c, e, b = self.chosen, self.everyone, self.best
        return (
            f"group ({self.mode}): train {names['train']}; feed {names['feed']}; stand by "
            f"{names['stand_by']}: predicted {c.samples_per_s:.1f} samples/s "
            f"({c.step_s * 1e3:.1f} ms/step, {c.exchange.backend}, {c.bound}-bound) vs "
            f"{e.samples_per_s:.1f} with every worker training (gain {self.gain:+.1%}, margin "
            f"{self.margin:.1%} from noise {self.noise:.1%}); best considered "
            f"{b.samples_per_s:.1f} ({self.considered} considered)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON, Ray messages, ``summary.json``)."""
        return dict(
            asdict(self),
            trainers=list(self.trainers),
            feeders=list(self.feeders),
            standing_by=list(self.standing_by),
            # JSON has no infinity: no shared pipeline is None.
            pipeline_samples_per_s=(
                self.pipeline_samples_per_s if math.isfinite(self.pipeline_samples_per_s) else None
            ),
            summary=self.summary(),
        )


class _Evaluator:
    """Predictions of assignments, cached (the same inputs for every candidate)."""

    def __init__(
        self,
        total: int,
        workers: Sequence[WorkerPrice],
        exchange: ExchangePrice,
        *,
        min_slice: int,
        quantum: int,
        pipeline: float,
        measured: Mapping[frozenset[int], float],
    ) -> None:
        self.total, self.workers, self.exchange = total, workers, exchange
        self.min_slice, self.quantum, self.pipeline = min_slice, quantum, pipeline
        self.measured = measured
        self._plans: dict[tuple[frozenset[int], bool], tuple[tuple[int, ...], float] | None] = {}
        self._exchanges: dict[frozenset[int], ExchangeCost] = {}
        self._cache: dict[tuple[frozenset[int], frozenset[int]], GroupPrediction] = {}

    def _plan(self, trainers: frozenset[int], fed: bool) -> tuple[tuple[int, ...], float] | None:
        key = (trainers, fed)
        if key not in self._plans:
            ranks = sorted(trainers)
            costs: list[CostModel] = [
                self.workers[r].fed_cost() if fed else self.workers[r].step for r in ranks
            ]
            try:
                slices = allocate(
                    self.total,
                    costs,
                    caps=[self.workers[r].cap for r in ranks],
                    min_slice=self.min_slice,
                    quantum=self.quantum,
                )
            except AllocationError:
                self._plans[key] = None
            else:
                step = makespan(slices, costs)
                if len(ranks) > 1 and self.exchange.batchnorm_layers > 0:
                    # Exact BatchNorm: the ranks meet in forward, loading and compute add up.
                    members = [self.workers[r] for r in ranks]
                    step = max(step, synchronised_makespan(slices, members, fed=fed))
                self._plans[key] = (slices, step)
        return self._plans[key]

    def exchange_of(self, trainers: frozenset[int]) -> ExchangeCost:
        if trainers not in self._exchanges:
            self._exchanges[trainers] = price_exchange(
                [self.workers[r] for r in sorted(trainers)],
                self.exchange,
                measured_gradient_s=self.measured.get(trainers),
            )
        return self._exchanges[trainers]

    def predict(self, trainers: frozenset[int], feeders: frozenset[int]) -> GroupPrediction:
        key = (trainers, feeders)
        if key in self._cache:
            return self._cache[key]
        n = len(self.workers)
        exchange = self.exchange_of(trainers)
        own, fed = self._plan(trainers, False), self._plan(trainers, True)
        if own is None or fed is None:
            prediction = GroupPrediction(
                tuple(sorted(trainers)),
                tuple(sorted(feeders)),
                (0,) * n,
                exchange,
                math.inf,
                0.0,
                "infeasible",
            )
        else:
            steps = self.total / (own[1] + exchange.exposed_s)
            compute = self.total / (fed[1] + exchange.exposed_s)
            delivery = min(steps, self.pipeline) + sum(
                self.workers[k].feed_samples_per_s for k in feeders
            )
            rate = min(compute, delivery)
            bound: Literal["loading", "compute", "pipeline"]
            if compute <= delivery:
                bound = "compute"
            elif self.pipeline < steps:
                bound = "pipeline"
            else:
                bound = "loading"
            slices_of = fed[0] if feeders and bound == "compute" else own[0]
            slices = [0] * n
            for rank, size in zip(sorted(trainers), slices_of):
                slices[rank] = int(size)
            prediction = GroupPrediction(
                tuple(sorted(trainers)),
                tuple(sorted(feeders)),
                tuple(slices),
                exchange,
                self.total / rate,
                rate,
                bound,
            )
        self._cache[key] = prediction
        return prediction

    def fewest_feeders(self, trainers: frozenset[int], eligible: Sequence[int]) -> frozenset[int]:
        """The fewest feeders (largest feed first) that reach the trainers' highest rate."""
        ranked = sorted(eligible, key=lambda k: (-self.workers[k].feed_samples_per_s, k))
        top = self.predict(trainers, frozenset(ranked)).samples_per_s
        for count in range(len(ranked) + 1):
            feeders = frozenset(ranked[:count])
            if self.predict(trainers, feeders).samples_per_s >= top * (1 - _REL):
                return feeders
        return frozenset(ranked)  # pragma: no cover - the full set reaches its own rate


def _trainer_sets(
    workers: Sequence[WorkerPrice], preference: Sequence[int]
) -> tuple[list[frozenset[int]], bool]:
    """The trainer sets to try, and whether they are all of them (up to interchangeable
    workers: identical prices but the name)."""
    classes: dict[WorkerPrice, list[int]] = {}
    for rank, w in enumerate(workers):
        classes.setdefault(replace(w, name=""), []).append(rank)
    members = list(classes.values())
    count = math.prod(len(m) + 1 for m in members) - 1
    if count > MAX_EXACT_SETS:
        return [frozenset(preference[:k]) for k in range(1, len(workers) + 1)], False
    sets = [
        frozenset(r for m, c in zip(members, counts) for r in m[:c])
        for counts in product(*(range(len(m) + 1) for m in members))
    ]
    return [t for t in sets if t], True


def _key_best(p: GroupPrediction) -> tuple[float, int, int, tuple[int, ...]]:
    return (-p.samples_per_s, -len(p.trainers), len(p.feeders), p.trainers)


def _check_inputs(total: int, workers: Sequence[WorkerPrice], mode: str, min_slice: int) -> None:
    if not workers:
        raise AllocationError("decide_group needs at least one worker's price")
    if int(total) < 1:
        raise AllocationError(f"decide_group: the global batch must be >= 1 sample, got {total}")
    if mode not in MODES:
        raise AllocationError(
            f"group mode {mode!r} is not one of {sorted(MODES)}: use auto (train, feed or "
            "stand by), train (no feeding) or all (every worker trains)"
        )
    if int(min_slice) < 1:
        raise AllocationError(f"decide_group: min_slice must be >= 1, got {min_slice}")


def _infeasible_message(
    total: int, workers: Sequence[WorkerPrice], min_slice: int, quantum: int, mode: str
) -> str:
    smallest = max(1, int(min_slice), int(quantum))
    for w in workers:
        if w.cap is not None and int(w.cap) < smallest and mode == "all":
            return (
                f"group (mode all): worker {w.name!r} can hold at most {w.cap} samples, less "
                f"than one slice ({smallest}). Fix: the default mode auto (it stands by), or "
                "raise its max_batch"
            )
    held = sum(total if w.cap is None else int(w.cap) for w in workers)
    if held < total:
        return (
            f"group: the workers' caps hold {held} samples in all, less than the global "
            f"batch {total}. Fix: lower global_batch_size or raise max_batch"
        )
    return (
        f"group (mode {mode}): no plan of {total} samples fits "
        f"{'every worker' if mode == 'all' else 'any group of the workers'} with slices of "
        f"at least {smallest}. Fix: raise global_batch_size or lower min_slice/ghost_size"
    )


def decide_group(
    total: int,
    workers: Sequence[WorkerPrice],
    exchange: ExchangePrice,
    *,
    noise: float,
    mode: GroupMode = "auto",
    min_slice: int = 1,
    quantum: int = 1,
    pipeline_samples_per_s: float = math.inf,
    measured_gradient_s: Mapping[Collection[int], float] | None = None,
) -> GroupDecision:
    """Decide what each worker does (see the module).

    Args:
        total: Global batch size B.
        workers: One price per worker, in rank order (:class:`WorkerPrice`).
        exchange: The step's exchanges, priced per backend (:class:`ExchangePrice`).
        noise: The prediction's relative error estimate
            (:func:`~raytrain_hetero.core.group_price.prediction_noise`), in [0, 1).
        mode: ``auto`` (default), ``train`` (nobody feeds) or ``all`` (everyone trains).
        min_slice: Smallest slice of any trainer (>= 1).
        quantum: Slices are whole multiples of it (ghost BatchNorm's group size, else 1).
        pipeline_samples_per_s: A shared input pipeline's delivery with every worker
            training (Ray Data), ``inf`` where each rank loads its own slices.
        measured_gradient_s: Gradient all-reduce seconds timed on given groups (sets of
            worker indices; admission's prefixes), instead of their priced link
            (:func:`~raytrain_hetero.core.group_price.price_exchange`).

    Raises:
        AllocationError: Bad inputs, or no group can hold the batch (mode ``all``: the whole
            group cannot), naming the worker or the caps and the fix.
    """
    _check_inputs(total, workers, mode, min_slice)
    margin = noise_margin(noise)
    if not float(pipeline_samples_per_s) > 0:
        raise AllocationError(
            f"pipeline_samples_per_s must be > 0 (inf: each rank loads its own), got "
            f"{pipeline_samples_per_s!r}"
        )
    n = len(workers)
    may_stand_by, may_feed = MODES[mode]
    measured = {
        frozenset(int(r) for r in k): float(v) for k, v in (measured_gradient_s or {}).items()
    }
    ev = _Evaluator(
        total,
        workers,
        exchange,
        min_slice=int(min_slice),
        quantum=int(quantum),
        pipeline=float(pipeline_samples_per_s),
        measured=measured,
    )
    preference = tuple(sorted(range(n), key=lambda r: (workers[r].step.time(total), r)))
    trainer_sets, exhaustive = _trainer_sets(workers, preference)
    trainer_sets += [k for k in measured if k and k not in set(trainer_sets)]
    everyone = ev.predict(frozenset(range(n)), frozenset())
    candidates: list[GroupPrediction] = []
    for trainers in trainer_sets:
        candidates.append(ev.predict(trainers, frozenset()))
        eligible = [k for k in range(n) if k not in trainers and workers[k].feed_samples_per_s > 0]
        if may_feed and eligible:
            candidates.append(ev.predict(trainers, ev.fewest_feeders(trainers, eligible)))
    feasible = [c for c in candidates if c.feasible]
    if not feasible or (mode == "all" and not everyone.feasible):
        raise AllocationError(_infeasible_message(total, workers, min_slice, quantum, mode))
    best = min(feasible, key=_key_best)
    chosen = everyone
    if may_stand_by:
        floor = everyone.samples_per_s * (1 + margin)
        within = [
            c
            for c in feasible
            if c.samples_per_s > floor and c.samples_per_s * (1 + margin) >= best.samples_per_s
        ]
        if within:
            chosen = min(
                within,
                key=lambda c: (n - len(c.trainers), len(c.feeders), *_key_best(c)),
            )
    gain = chosen.samples_per_s / everyone.samples_per_s - 1 if everyone.feasible else math.inf
    verdicts = tuple(_verdict(ev, r, chosen, everyone, best, margin, mode) for r in range(n))
    return GroupDecision(
        mode=mode,
        global_batch_size=int(total),
        workers=verdicts,
        chosen=chosen,
        best=best,
        everyone=everyone,
        noise=float(noise),
        margin=margin,
        gain=gain,
        considered=len(candidates),
        exhaustive=exhaustive,
        preference=preference,
        pipeline_samples_per_s=float(pipeline_samples_per_s),
    )


def _verdict(
    ev: _Evaluator,
    rank: int,
    chosen: GroupPrediction,
    everyone: GroupPrediction,
    best: GroupPrediction,
    margin: float,
    mode: str,
) -> WorkerVerdict:
    """One worker's verdict, its counterfactual and the reason in words."""
    w = ev.workers[rank]
    trainers, feeders = frozenset(chosen.trainers), frozenset(chosen.feeders)
    rate = chosen.samples_per_s
    alone = w.alone_samples_per_s(ev.total)
    verdict: Verdict
    if rank in trainers:
        verdict = "train"
        if len(trainers) == 1:
            other = 0.0
            reason = f"the only trainer ({alone:.1f} samples/s alone)"
        else:
            other = ev.predict(trainers - {rank}, feeders).samples_per_s
            without = f"{other:.1f}" if other > 0 else "no plan that fits"
            reason = (
                f"trains {chosen.slices[rank]} of {ev.total} samples ({alone:.1f}/s alone): "
                f"the group predicts {rate:.1f} samples/s with it, {without} without"
            )
            if other > rate:
                reason += (
                    f" (leaving it out predicts {other / rate - 1:+.1%}, inside the "
                    f"{margin:.1%} margin)"
                    if mode != "all"
                    else " (mode all)"
                )
    else:
        other = ev.predict(trainers | {rank}, feeders - {rank}).samples_per_s
        training = f"{other:.1f}" if other > 0 else "no plan that fits"
        if rank in feeders:
            verdict = "feed"
            idle = ev.predict(trainers, feeders - {rank}).samples_per_s
            reason = (
                f"feeds {w.feed_samples_per_s:.1f} samples/s of loading: the group predicts "
                f"{rate:.1f} samples/s, {idle:.1f} with it standing by, {training} with it "
                "training"
            )
        else:
            verdict = "stand_by"
            reason = (
                f"stands by ({alone:.1f} samples/s alone): the group predicts {rate:.1f} "
                f"samples/s without it, {training} with it training"
            )
            if everyone.feasible and chosen is not everyone:
                reason += (
                    f"; every worker training {everyone.samples_per_s:.1f} (best considered "
                    f"{best.samples_per_s:.1f}, margin {margin:.1%})"
                )
    return WorkerVerdict(
        index=rank,
        worker=w.name,
        verdict=verdict,
        slice=chosen.slices[rank],
        alone_samples_per_s=alone,
        feed_samples_per_s=w.feed_samples_per_s,
        alternative_samples_per_s=other,
        reason=reason,
    )
