"""How many Tune trials a cluster holds at once, each with its whole worker group.

Tune reserves only each trial's driver (``trial_cpus``); its worker group comes from Ray
Train's own placement group, granted all at once or not at all. Unless
``tune.max_concurrent_trials`` says otherwise, :func:`concurrent_capacity` packs whole trials
(driver + every worker, label selectors honoured) onto the nodes and runs as many as fit, so no
trial waits on another's workers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.core.placement import selector_matches
from raytrain_hetero.errors import ConfigError

__all__ = ["cluster_nodes", "concurrent_capacity", "decide_concurrency"]

logger = logging.getLogger(__name__)


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v > 0)


def _take(need: Mapping[str, float], have: dict[str, float]) -> None:
    for k, v in need.items():
        have[k] = have.get(k, 0.0) - v


def concurrent_capacity(
    nodes: Sequence[Mapping[str, Any]],
    workers: Sequence[WorkerSpec],
    trial_cpus: float,
    limit: int,
) -> int:
    """How many trials the nodes hold at once, each with its whole worker group.

    Packs, trial after trial, each worker (all of its resources, on one node matching its
    label selector, largest first) and the trial's driver (``trial_cpus`` CPUs, anywhere)
    onto the nodes' total resources, first fit.

    Args:
        nodes: Nodes as ``{"resources": {...}, "labels": {...}}``.
        workers: The worker group of every trial, one spec per worker (``count == 1``, e.g.
            :func:`~raytrain_hetero.config.expand_worker_specs`).
        trial_cpus: CPUs each trial's driver reserves.
        limit: Stop counting here (the number of trials).

    Returns:
        The number of trials that fit (0 if not even one does).
    """
    free = [dict(n.get("resources") or {}) for n in nodes]
    labels = [dict(n.get("labels") or {}) for n in nodes]
    ordered = sorted(workers, key=lambda s: -sum(s.resources.values()))
    for count in range(limit):
        trial_free = [dict(f) for f in free]
        for spec in ordered:
            for i, have in enumerate(trial_free):
                if selector_matches(spec.label_selector or {}, labels[i]) and _fits(
                    spec.resources, have
                ):
                    _take(spec.resources, have)
                    break
            else:
                return count
        driver = {"CPU": trial_cpus}
        for have in trial_free:
            if _fits(driver, have):
                _take(driver, have)
                break
        else:
            return count
        free = trial_free
    return limit


def cluster_nodes() -> list[dict[str, Any]]:
    """Alive nodes of the connected Ray cluster as ``{"resources", "labels"}``."""
    return [
        {"resources": dict(n.get("Resources") or {}), "labels": dict(n.get("Labels") or {})}
        for n in ray.nodes()
        if n.get("Alive")
    ]


def decide_concurrency(
    workers: Sequence[WorkerSpec],
    nodes: Sequence[Mapping[str, Any]],
    *,
    trial_cpus: float,
    trials: int,
    max_concurrent_trials: int | None = None,
    local: bool,
) -> int:
    """Trials to run at once: ``max_concurrent_trials``, else as many as fit (at most ``trials``).

    Args:
        workers: The worker group of every trial, one spec per worker.
        nodes: Nodes as ``{"resources": {...}, "labels": {...}}`` (:func:`cluster_nodes`).
        trial_cpus: CPUs each trial's driver reserves.
        trials: Trials the search runs in all.
        max_concurrent_trials: The user's cap, or ``None`` to run as many as fit.
        local: Whether Ray is an embedded local instance (no autoscaler to add nodes).

    Raises:
        ConfigError: On an embedded local Ray (``local``) that cannot hold even one trial.
    """
    fit = concurrent_capacity(nodes, workers, trial_cpus, limit=max(trials, 1))
    if fit == 0:
        per_trial_cpu = sum(s.resources.get("CPU", 0.0) for s in workers)
        message = (
            f"not even one trial fits this Ray cluster: a trial needs its workers "
            f"({', '.join(f'{s.name}: {dict(s.resources)}' for s in workers)}) "
            f"plus {trial_cpus:g} CPU for its driver"
        )
        if local:
            raise ConfigError(
                f"{message}. Fix: raise ray.num_cpus to >= {per_trial_cpu + trial_cpus:g}, "
                "or use fewer/smaller workers."
            )
        logger.warning("%s; trials will wait for the autoscaler to add nodes", message)
        return max_concurrent_trials or 1
    if max_concurrent_trials is None:
        return min(fit, trials)
    if max_concurrent_trials > fit:
        logger.warning(
            "max_concurrent_trials=%d but the cluster holds %d trial(s) at once: the "
            "others wait for workers (on an autoscaling cluster, for new nodes)",
            max_concurrent_trials,
            fit,
        )
    return max_concurrent_trials
