"""What a step of a worker group costs: the workers' prices, the group's exchange, the noise.

The inputs of the group decision (:mod:`raytrain_hetero.core.group_decision`), priced here so
that any group of the workers, including ones that never ran together, can be predicted:

* :class:`WorkerPrice`: a worker's **loader-bound** step cost ``t(b) = alpha + beta * b``
  (from asking the loader for its slice to the optimizer step, the wait for data included:
  what its step really costs), optionally the same step with its data already loaded
  (``compute``: what feeding can bring it down to), its slice cap, its device, what it adds
  when it feeds instead of training, and the extra wait a gradient exchange pays when it is a
  member (a slow link).
* :class:`ExchangePrice`: one step's exchanges, priced per backend. Among CUDA ranks only,
  NCCL (:attr:`ExchangePrice.nccl`); as soon as a CPU rank is a member, gloo
  (:attr:`ExchangePrice.gloo`), and every CUDA member stages each exchanged byte through host
  memory (a device-to-host and a host-to-device copy at
  :attr:`ExchangePrice.host_bytes_per_s`). Exact BatchNorm adds two exchanges per layer and
  step (the forward all-gather of the statistics, the backward all-reduce of the two sums);
  they sit on the step's critical path. Each backend's :class:`LinkCost` is **measured** (a
  ring all-reduce timed at two sizes on the real group, :func:`fit_link_cost`).
* **Exact BatchNorm synchronises the ranks in forward** (:func:`synchronised_makespan`): at
  the first BatchNorm layer every rank waits for the slowest rank's data, so one rank's
  loading cannot overlap another rank's compute. A group of two or more trainers under exact
  BatchNorm then steps in ``max_r load_r(b_r) + max_r compute_r(b_r)``, not in
  ``max_r (load_r + compute_r)(b_r)``: a worker bound by its loader beside workers bound by
  their compute pays both. Where a worker's loading is not known apart from its compute
  (:attr:`WorkerPrice.compute` ``None``), its whole step counts as compute.
  :func:`loading_per_sample` and :func:`compute_cost` split a measured step in two.
* The gradient all-reduce's **overlap with backward** (:attr:`ExchangePrice.overlap`, the
  fraction hidden under backward) is **modelled**, a parameter, not fitted here: only a group
  that trains shows it (exposed exchange = the step's wall time minus its slowest rank's busy
  time), while the decision must price groups that never trained. The default 0 prices the
  gradient exchange in full (Pollux's ``gamma = 1``); :func:`implied_overlap` reads the
  overlap a training group showed, for the next decision of the same run.
* The prediction's **noise** (:func:`prediction_noise`): a relative error estimate from the
  spread of the measured step times (robust: ``1.4826 * MAD / median`` per worker), as the
  standard error of a cost estimated from ``n`` of them (the spread over ``sqrt(n)``: a
  worker's price is fitted to all its steps, so it is off by much less than one step
  scatters), the largest over the workers, because the makespan is a maximum; from the
  prediction's own track record in this run (``|measured / predicted - 1|`` of earlier
  decisions: the model's own error, which more steps do not shrink), and never below a
  floor (timer and scheduling granularity). :func:`noise_margin` turns it into the margin two
  predictions must differ by before one is believed better.

Pure: standard library and numpy only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from raytrain_hetero.core.allocation import CostModel, fit_cost_model
from raytrain_hetero.errors import AllocationError

__all__ = [
    "DEFAULT_NOISE_FLOOR",
    "ExchangeCost",
    "ExchangePrice",
    "LinkCost",
    "WorkerPrice",
    "compute_cost",
    "fit_link_cost",
    "implied_overlap",
    "loading_per_sample",
    "noise_margin",
    "prediction_noise",
    "price_exchange",
    "relative_noise",
    "synchronised_makespan",
]

#: Smallest relative noise a prediction is credited with (timers, scheduling, rounding).
DEFAULT_NOISE_FLOOR = 0.02

#: The normal distribution's MAD-to-standard-deviation factor.
_MAD_TO_SIGMA = 1.4826


def _finite(value: float, name: str, *, low: float = 0.0, strict: bool = False) -> float:
    number = float(value)
    bad = not math.isfinite(number) or (number <= low if strict else number < low)
    if bad:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise AllocationError(f"{name} must be a finite number {bound}, got {value!r}")
    return number


@dataclass(frozen=True)
class WorkerPrice:
    """What one worker's step costs, and what it could do instead of training.

    Attributes:
        name: The worker's name (its WorkerSpec's, expanded).
        step: Loader-bound step cost ``t(b) = alpha + beta * b`` seconds: from asking for a
            slice of ``b`` samples to the optimizer step, the wait for data included (measured
            passively on training steps, or by the probe with its loader).
        compute: The same step with the data already loaded (forward, backward, optimizer),
            the floor feeding can bring the worker to; ``None``: not separable (feeding cannot
            speed it up).
        device: ``"cpu"`` or ``"cuda"``: which backend its exchanges use, and whether they are
            staged through host memory.
        cap: Most samples a step of it may hold (memory), ``None``: no cap.
        feed_samples_per_s: Samples/s of loading it takes off the trainers when it feeds
            instead of training (measured: what the trainers' input delivery gains with its
            CPUs loading for them); 0: it cannot feed.
        exchange_delay_s: Extra seconds every gradient exchange waits when it is a member (a
            slow link; measured as the excess of an exchange it joins, or EMULATED).
    """

    name: str
    step: CostModel
    compute: CostModel | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    cap: int | None = None
    feed_samples_per_s: float = 0.0
    exchange_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise AllocationError(
                f"worker {self.name!r}: device must be 'cpu' or 'cuda', got {self.device!r}"
            )
        if self.cap is not None and int(self.cap) < 0:
            raise AllocationError(
                f"worker {self.name!r}: cap must be >= 0 samples or None, got {self.cap!r}"
            )
        _finite(self.feed_samples_per_s, f"worker {self.name!r}: feed_samples_per_s")
        _finite(self.exchange_delay_s, f"worker {self.name!r}: exchange_delay_s")

    def fed_cost(self) -> CostModel:
        """The step cost with its data loaded for it (``compute``, or ``step`` if unknown)."""
        return self.compute if self.compute is not None else self.step

    def loading_cost(self, size: int) -> float:
        """Seconds of its step at ``size`` samples spent before its compute (the wait for
        data: loading, collating, the copy to its device); 0 when not known apart."""
        if self.compute is None or size <= 0:
            return 0.0
        return max(0.0, self.step.time(size) - self.compute.time(size))

    def alone_samples_per_s(self, total: int) -> float:
        """Loader-bound samples/s on the whole batch alone (at its cap if it holds less)."""
        batch = total if self.cap is None else max(0, min(total, int(self.cap)))
        return batch / self.step.time(batch) if batch > 0 else 0.0


@dataclass(frozen=True)
class LinkCost:
    """One backend's measured collective cost: a ring all-reduce of ``x`` bytes over ``n``
    members takes ``calls * 2(n-1) * latency_s + 2(n-1)/n * x / bytes_per_s`` seconds.

    Attributes:
        latency_s: Seconds per ring hop and call (>= 0).
        bytes_per_s: Bytes per second one hop moves (> 0; ``inf``: free).
    """

    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        _finite(self.latency_s, "LinkCost.latency_s")
        if not (float(self.bytes_per_s) > 0):  # inf: a free link
            raise AllocationError(
                f"LinkCost.bytes_per_s must be > 0 (inf: free), got {self.bytes_per_s!r}"
            )

    def allreduce_s(self, nbytes: float, members: int, *, calls: int = 1) -> float:
        """Seconds of ``calls`` ring all-reduces moving ``nbytes`` in all (0 for one member)."""
        if members < 2 or (calls <= 0 and nbytes <= 0):
            return 0.0
        hops = 2 * (members - 1)
        return max(calls, 0) * hops * self.latency_s + hops / members * nbytes / self.bytes_per_s


def fit_link_cost(nbytes: Sequence[float], seconds: Sequence[float], members: int) -> LinkCost:
    """The :class:`LinkCost` of all-reduces timed on a group of ``members`` ranks.

    ``nbytes[j]`` bytes took ``seconds[j]`` (one call each; >= 2 distinct sizes, e.g. 1 KiB
    and the gradient's size). The affine fit ``t = a + b * x`` is
    :func:`~raytrain_hetero.core.allocation.fit_cost_model`'s; ``a`` is ``2(n-1)`` hops of
    latency, ``b`` is ``2(n-1)/n`` over the bandwidth.

    Raises:
        AllocationError: Fewer than 2 members, or timings the fit refuses.
    """
    if members < 2:
        raise AllocationError(
            f"fit_link_cost needs a group of >= 2 members to time an all-reduce, got {members}"
        )
    fitted = fit_cost_model(nbytes, seconds)
    hops = 2 * (members - 1)
    return LinkCost(latency_s=fitted.alpha / hops, bytes_per_s=hops / (members * fitted.beta))


@dataclass(frozen=True)
class ExchangePrice:
    """One step's exchanges, to be priced for any group (see the module).

    Attributes:
        gradient_bytes: Bytes of the gradient all-reduce per step (the model's gradients).
        gloo: The gloo backend's measured cost (any group with a CPU rank).
        nccl: NCCL's measured cost among CUDA ranks; ``None``: not measured (gloo is used).
        gradient_calls: All-reduce calls the gradient takes per step (DDP buckets).
        batchnorm_layers: Exact BatchNorm layers (two exchanges each per step; 0 under
            ghost or local BatchNorm).
        batchnorm_bytes: Bytes one layer's two exchanges move together per step.
        host_bytes_per_s: Device-to-host (and back) copy rate of a CUDA rank: under gloo every
            exchanged byte goes through host memory twice. ``inf``: free.
        overlap: Fraction of the gradient exchange hidden under backward, in [0, 1]
            (MODELLED, see the module); BatchNorm's exchanges are never hidden.
    """

    gradient_bytes: float
    gloo: LinkCost
    nccl: LinkCost | None = None
    gradient_calls: int = 1
    batchnorm_layers: int = 0
    batchnorm_bytes: float = 0.0
    host_bytes_per_s: float = math.inf
    overlap: float = 0.0

    def __post_init__(self) -> None:
        _finite(self.gradient_bytes, "ExchangePrice.gradient_bytes")
        _finite(self.batchnorm_bytes, "ExchangePrice.batchnorm_bytes")
        if not (self.host_bytes_per_s > 0):
            raise AllocationError(
                f"ExchangePrice.host_bytes_per_s must be > 0 (inf: free), "
                f"got {self.host_bytes_per_s!r}"
            )
        if int(self.gradient_calls) < 1 or int(self.batchnorm_layers) < 0:
            raise AllocationError(
                "ExchangePrice: gradient_calls must be >= 1 and batchnorm_layers >= 0, got "
                f"{self.gradient_calls!r} and {self.batchnorm_layers!r}"
            )
        overlap = float(self.overlap)
        if not (0.0 <= overlap <= 1.0):
            raise AllocationError(
                f"ExchangePrice.overlap is the fraction of the gradient exchange hidden under "
                f"backward, in [0, 1]; got {self.overlap!r}"
            )

    @classmethod
    def free(cls) -> ExchangePrice:
        """An exchange that costs nothing (for tests and single-process reasoning)."""
        return cls(gradient_bytes=0.0, gloo=LinkCost(0.0, math.inf))


@dataclass(frozen=True)
class ExchangeCost:
    """The priced exchanges of one group's step.

    Attributes:
        backend: ``"nccl"``, ``"gloo"`` or ``"none"`` (one member).
        gradient_s: The gradient all-reduce (the link, its members' link delays and, under
            gloo with CUDA members, the staging through host memory), before overlap.
        batchnorm_s: Exact BatchNorm's exchanges (staging included).
        exposed_s: What the step pays: ``(1 - overlap) * gradient_s + batchnorm_s``.
        measured: Whether the gradient all-reduce's link part was measured on this group.
    """

    backend: Literal["nccl", "gloo", "none"]
    gradient_s: float
    batchnorm_s: float
    exposed_s: float
    measured: bool = False


def price_exchange(
    members: Sequence[WorkerPrice],
    price: ExchangePrice,
    *,
    measured_gradient_s: float | None = None,
) -> ExchangeCost:
    """The exchanges of one step of the group ``members`` (see the module).

    ``measured_gradient_s``: a gradient-sized all-reduce timed on exactly this group, slow
    links included (what admission's prefixes measure: host tensors, so no staging). It
    replaces the priced link and link delays of the gradient exchange; staging through host
    memory, exact BatchNorm's exchanges and the overlap are still priced.
    """
    n = len(members)
    if n < 2:
        return ExchangeCost("none", 0.0, 0.0, 0.0)
    gpus = sum(m.device == "cuda" for m in members)
    nccl = gpus == n and price.nccl is not None
    link = price.nccl if nccl and price.nccl is not None else price.gloo
    staged = gpus > 0 and not nccl and math.isfinite(price.host_bytes_per_s)
    bn_bytes = price.batchnorm_layers * price.batchnorm_bytes
    if measured_gradient_s is not None:
        gradient = _finite(measured_gradient_s, "a measured gradient all-reduce")
    else:
        gradient = link.allreduce_s(price.gradient_bytes, n, calls=price.gradient_calls)
        gradient += max(m.exchange_delay_s for m in members) * price.gradient_calls
    batchnorm = link.allreduce_s(bn_bytes, n, calls=2 * price.batchnorm_layers)
    if staged:
        gradient += 2.0 * price.gradient_bytes / price.host_bytes_per_s
        batchnorm += 2.0 * bn_bytes / price.host_bytes_per_s
    exposed = (1.0 - price.overlap) * gradient + batchnorm
    return ExchangeCost(
        "nccl" if nccl else "gloo", gradient, batchnorm, exposed, measured_gradient_s is not None
    )


def loading_per_sample(
    slices: Sequence[int], busy_s: Sequence[float], compute_s: Sequence[float]
) -> float:
    """A worker's seconds of loading per sample, from its measured steps (pure).

    ``busy_s[j]`` is step j's loader-bound seconds (data wait included), ``compute_s[j]`` its
    compute alone, at a slice of ``slices[j]``; loading is what the step spent beyond its
    compute. Returns the median over the steps of ``(busy - compute) / slice``, at least 0;
    ``nan`` when no step has a positive slice and finite, positive timings (compute unknown).
    """
    ratios = [
        max(0.0, float(b) - float(c)) / int(n)
        for n, b, c in zip(slices, busy_s, compute_s)
        if int(n) > 0
        and math.isfinite(float(b))
        and math.isfinite(float(c))
        and float(b) > 0
        and float(c) > 0
    ]
    return statistics.median(ratios) if ratios else math.nan


def compute_cost(step: CostModel, loading_s_per_sample: float) -> CostModel | None:
    """A worker's step with its data already loaded: ``step`` less its loading (pure).

    Loading is priced per sample (reading and collating scale with the slice), the fixed
    part of a step is compute: ``alpha`` stays, ``beta`` loses ``loading_s_per_sample`` (kept
    above 0.1 % of itself: a cost model's ``beta`` is positive). ``None`` when the loading is
    unknown (``nan``) or negative.
    """
    loading = float(loading_s_per_sample)
    if not math.isfinite(loading) or loading < 0:
        return None
    return CostModel(step.alpha, max(step.beta - loading, step.beta * 1e-3))


def synchronised_makespan(
    slices: Sequence[int], workers: Sequence[WorkerPrice], *, fed: bool = False
) -> float:
    """Seconds of a step whose ranks synchronise in forward (exact BatchNorm; see the module).

    ``max_r load_r(b_r) + max_r compute_r(b_r)`` over the workers with a slice: the first
    BatchNorm layer waits for the slowest rank's data, then for the slowest rank's compute.
    ``fed``: their data is loaded for them (feeders), so only compute counts.
    """
    loading = 0.0
    compute = 0.0
    for size, worker in zip(slices, workers):
        if int(size) <= 0:
            continue
        if fed:
            compute = max(compute, worker.fed_cost().time(int(size)))
            continue
        load = worker.loading_cost(int(size))
        loading = max(loading, load)
        compute = max(compute, worker.step.time(int(size)) - load)
    return loading + compute


def implied_overlap(step_s: float, busy_s: float, cost: ExchangeCost) -> float:
    """The overlap a trained group showed: ``1 - (step - busy - batchnorm) / gradient``.

    ``step_s``: its measured step time; ``busy_s``: its slowest rank's busy time in the step
    (compute and loading). Clipped to [0, 1]; 0 when there is no gradient exchange.
    """
    if cost.gradient_s <= 0:
        return 0.0
    exposed = max(0.0, float(step_s) - float(busy_s) - cost.batchnorm_s)
    return min(1.0, max(0.0, 1.0 - exposed / cost.gradient_s))


def relative_noise(seconds: Sequence[float]) -> float:
    """Robust relative spread of repeated timings: ``1.4826 * MAD / median`` (0 for < 2)."""
    values = [float(s) for s in seconds if math.isfinite(float(s)) and float(s) > 0]
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    mad = statistics.median(abs(v - middle) for v in values)
    return _MAD_TO_SIGMA * mad / middle


def prediction_noise(
    step_seconds: Sequence[Sequence[float]],
    *,
    past_errors: Sequence[float] = (),
    floor: float = DEFAULT_NOISE_FLOOR,
) -> float:
    """Relative error estimate of a group prediction (see the module).

    Args:
        step_seconds: Per worker, its measured step times (loader-bound, at any slices of
            one plan: each worker's spread is relative to its own median).
        past_errors: ``measured / predicted - 1`` of earlier decisions of this run (their
            absolute values' median counts).
        floor: The smallest estimate returned.

    Returns:
        The largest of the floor, the workers' standard errors (relative spread over the
        square root of its step count) and the median past error, capped at 0.9 (a
        prediction known to no better than that is no prediction).
    """
    spreads = [relative_noise(s) / math.sqrt(max(1, len(s))) for s in step_seconds]
    errors = [abs(float(e)) for e in past_errors if math.isfinite(float(e))]
    track = statistics.median(errors) if errors else 0.0
    return min(0.9, max(_finite(floor, "noise floor"), *spreads, track))


def noise_margin(noise: float) -> float:
    """Relative gain two predictions, each within ``±noise``, must differ by to be believed.

    Each of two predictions may be off by a factor in ``[1 - noise, 1 + noise]``, so their
    ratio by one in ``[(1 - noise) / (1 + noise), (1 + noise) / (1 - noise)]``: a predicted
    gain of at most ``(1 + noise) / (1 - noise) - 1`` may be no gain at all.

    Raises:
        AllocationError: ``noise`` outside [0, 1).
    """
    eps = float(noise)
    if not (0.0 <= eps < 1.0):
        raise AllocationError(
            f"noise is a relative error estimate in [0, 1), got {noise!r}; "
            "estimate it with prediction_noise"
        )
    return (1.0 + eps) / (1.0 - eps) - 1.0
