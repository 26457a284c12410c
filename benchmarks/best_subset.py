"""The ``best-subset`` contender: the best subset of a scenario's workers, found by the benchmark.

"Never slower than the simple choice" needs the simple choice measured, not predicted: the
best single worker or subset of workers training alone (every worker of it training, the
library's static plan probed before step 0, nobody feeding). Running every subset of n workers
costs 2**n - 1 fits; the search here is the cheapest one whose shortcuts each rest on a
stated fact:

1. **Interchangeable workers** (identical specs but the name) are merged: only how many of a
   kind train matters (:func:`worker_classes`).
2. **Dominated kinds are pruned** (:func:`dominates`): a kind with the same device, label
   selector and resource names, no more of any resource, no higher cap, and no lower emulated
   slowdown or link delay than another is never used while one of the other kind is left
   unused: swapping them gives a group at least as fast (:func:`candidate_subsets`).
3. **Bounds skip the hopeless** (with more than :data:`SCREEN_ALL` candidates): a
   data-parallel group never exceeds the sum of its members' samples/s alone (efficiency
   <= 1), each measured alone at the whole batch; a candidate whose sum, raised by
   :data:`SLACK` for the measurement's noise, is below the best figure screened so far is
   skipped (:func:`should_skip`).
4. The rest are **screened** by short fits (``--screen-steps``, evaluation only at the end)
   in the scenario's Ray session; the best screened subset then runs as the counted
   ``best-subset`` fit of every repeat, alternating with the other contenders.

What it cannot see: a subset mis-ranked by the screening's noise (the figures are kept in
``bench.json`` under ``best_subset``), and feeding (a worker that feeds is not a subset).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

__all__ = [
    "SCREEN_ALL",
    "SLACK",
    "Candidate",
    "candidate_subsets",
    "dominates",
    "find_best_subset",
    "should_skip",
    "upper_bound",
    "worker_classes",
]

#: Up to this many candidates are all screened (timing every kind alone would cost more).
SCREEN_ALL = 4

#: Relative noise allowed to an alone figure before a bound rules a candidate out.
SLACK = 0.15


def _kind(spec: Any) -> dict[str, Any]:
    """What makes a worker what it is: its spec without the name, device resolved."""
    fields = dict(spec.model_dump())
    fields.pop("name", None)
    fields.pop("count", None)
    fields["device"] = spec.resolved_device()
    return fields


def worker_classes(specs: Sequence[Any]) -> list[list[int]]:
    """Indices of interchangeable workers (identical but the name), in order of appearance."""
    classes: dict[str, list[int]] = {}
    for index, spec in enumerate(specs):
        classes.setdefault(json.dumps(_kind(spec), sort_keys=True), []).append(index)
    return list(classes.values())


def _cap_at_least(a: int | None, b: int | None) -> bool:
    return a is None or (b is not None and a >= b)


def dominates(a: Any, b: Any) -> bool:
    """Whether a worker of spec ``a`` is at least as able as one of spec ``b`` in every
    respect the benchmark varies, and not identical (see the module, fact 2)."""
    ka, kb = _kind(a), _kind(b)
    if ka == kb:
        return False
    ra, rb = ka["resources"], kb["resources"]
    return (
        ka["device"] == kb["device"]
        and ka["label_selector"] == kb["label_selector"]
        and set(ra) == set(rb)
        and all(ra[k] >= rb[k] for k in ra)
        and _cap_at_least(ka["max_batch"], kb["max_batch"])
        and _cap_at_least(ka["max_micro_batch"], kb["max_micro_batch"])
        and ka["emulated_slowdown"] <= kb["emulated_slowdown"]
        and ka["emulated_collective_delay_s"] <= kb["emulated_collective_delay_s"]
    )


def candidate_subsets(specs: Sequence[Any]) -> list[tuple[int, ...]]:
    """The subsets worth running (facts 1 and 2), each the first workers of each kind."""
    classes = worker_classes(specs)
    better = [
        [j for j, other in enumerate(classes) if dominates(specs[other[0]], specs[mine[0]])]
        for mine in classes
    ]
    subsets = []
    for counts in product(*(range(len(c) + 1) for c in classes)):
        if not any(counts):
            continue
        wasted = any(
            counts[k] > 0 and any(counts[j] < len(classes[j]) for j in better[k])
            for k in range(len(classes))
        )
        if not wasted:
            subsets.append(tuple(sorted(i for c, n in zip(classes, counts) for i in c[:n])))
    return subsets


def upper_bound(subset: Sequence[int], alone: Sequence[float]) -> float:
    """The most samples/s the subset can reach: the sum of its members' alone figures."""
    return float(sum(alone[i] for i in subset))


def should_skip(bound: float, best: float, slack: float = SLACK) -> bool:
    """Whether a candidate of this bound cannot beat the best screened figure (fact 3)."""
    return best > 0 and bound * (1 + slack) < best


@dataclass
class Candidate:
    """One subset and what the search learnt about it.

    Attributes:
        workers: Indices into the scenario's (expanded) workers.
        names: Their names.
        bound: Summed alone samples/s (None: not measured).
        samples_per_s: Screened samples/s (None: not screened).
        skipped: Why it was not screened ("" if screened).
    """

    workers: tuple[int, ...]
    names: tuple[str, ...]
    bound: float | None = None
    samples_per_s: float | None = None
    skipped: str = ""


def find_best_subset(
    setup: Any, options: Mapping[str, Any], logs: Path, *, screen_steps: int
) -> dict[str, Any]:
    """Search the best subset on the live Ray session (see the module); sets
    ``setup.best_subset`` to it and returns what ``bench.json`` keeps under ``best_subset``."""
    from benchmarks.analysis import fit_figures
    from benchmarks.contenders import measure_alone_speeds, run_fit

    specs = setup.specs
    names = [s.name for s in specs]
    candidates = [
        Candidate(subset, tuple(names[i] for i in subset)) for subset in candidate_subsets(specs)
    ]
    alone: list[float] | None = None
    if len(candidates) > SCREEN_ALL:
        batch = int(setup.global_batch_size)
        jobs = [
            {
                "worker": s.name,
                "factor": float(s.emulated_slowdown),
                "slice": batch if s.max_batch is None else min(batch, int(s.max_batch)),
            }
            for s in (specs[c[0]] for c in worker_classes(specs))
        ]
        speeds = measure_alone_speeds(setup, jobs, steps=int(options.get("alone_steps", 5)))
        by_kind = {
            json.dumps(_kind(specs[c[0]]), sort_keys=True): speeds[
                (float(specs[c[0]].emulated_slowdown), j["slice"], specs[c[0]].name)
            ]
            for c, j in zip(worker_classes(specs), jobs)
        }
        alone = [by_kind[json.dumps(_kind(s), sort_keys=True)] for s in specs]
        for candidate in candidates:
            candidate.bound = upper_bound(candidate.workers, alone)
        candidates.sort(key=lambda c: (-(c.bound or 0.0), -len(c.workers)))
    if len(candidates) == 1:
        candidates[0].skipped = "the only candidate: nothing to screen"
        setup.best_subset = candidates[0].workers
        return _record(candidates, candidates[0], names, alone, screen_steps)
    saved = (setup.max_steps, setup.eval_every, setup.best_subset)
    best = 0.0
    try:
        setup.max_steps, setup.eval_every = int(screen_steps), 0
        for index, candidate in enumerate(candidates):
            if candidate.bound is not None and should_skip(candidate.bound, best):
                candidate.skipped = (
                    f"bound {candidate.bound:.1f} samples/s (+{SLACK:.0%}) below the best "
                    f"screened {best:.1f}"
                )
                continue
            setup.best_subset = candidate.workers
            fit = run_fit(setup, "best-subset", logs / f"screen-{index:02d}")
            figures = fit_figures(
                fit["records"],
                global_batch_size=setup.global_batch_size,
                target_accuracy=float(options["target_accuracy"]),
            )
            candidate.samples_per_s = float(figures["samples_per_s"])
            best = max(best, candidate.samples_per_s)
            print(
                f"best-subset screening: {', '.join(candidate.names)}: "
                f"{candidate.samples_per_s:.1f} samples/s",
                flush=True,
            )
    finally:
        setup.max_steps, setup.eval_every, setup.best_subset = saved
    screened = [c for c in candidates if c.samples_per_s is not None]
    chosen = max(screened, key=lambda c: (c.samples_per_s, len(c.workers)))
    setup.best_subset = chosen.workers
    return _record(candidates, chosen, names, alone, screen_steps)


def _record(
    candidates: Sequence[Candidate],
    chosen: Candidate,
    names: Sequence[str],
    alone: Sequence[float] | None,
    screen_steps: int,
) -> dict[str, Any]:
    return {
        "chosen": list(chosen.names),
        "chosen_workers": list(chosen.workers),
        "screen_steps": int(screen_steps),
        "alone_samples_per_s": None if alone is None else dict(zip(names, alone)),
        "candidates": [c.__dict__ for c in candidates],
    }
