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
    """How many trials (at most ``limit``) the nodes (``{"resources", "labels"}``) hold at
    once: trial after trial, each worker of ``workers`` (one spec per worker slot, largest first,
    on a node its label selector matches) and the trial's driver (``trial_cpus``, anywhere) are
    packed first-fit onto the nodes' total resources; 0 if not even one trial fits.
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
    """Trials to run at once: ``max_concurrent_trials``, else as many as fit the ``nodes``
    (:func:`cluster_nodes`), at most ``trials``.

    Raises:
        ConfigError: An embedded local Ray (``local``: no autoscaler) cannot hold one trial.
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
