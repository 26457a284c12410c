"""Ray Tune searches over HeteroTrainer runs: search domains and the trial scheduler.

A library-level integration that knows nothing of the YAML job: the pieces are
:mod:`~raytrain_hetero.tune.trial` (the report callback and the clean stop of a trial's Train
run), :mod:`~raytrain_hetero.tune.capacity` (how many trials run at once),
:mod:`~raytrain_hetero.tune.results` (rows, plot) and, here, :func:`param_space` (Tune domains
from plain distributions) and :func:`trial_scheduler`. The search over a YAML job
(``raytrain-hetero tune``) is :mod:`raytrain_hetero.app.tune_job`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.tune.capacity import cluster_nodes, concurrent_capacity, decide_concurrency
from raytrain_hetero.tune.results import TRIAL_COLUMNS, plot_trials, trial_rows, write_trials_csv
from raytrain_hetero.tune.trial import (
    HeteroTuneReportCallback,
    abort_train_on_stop,
    throughput_metrics,
    trial_report_callback,
)

__all__ = [
    "DISTRIBUTION_KINDS",
    "TRIAL_COLUMNS",
    "HeteroTuneReportCallback",
    "abort_train_on_stop",
    "cluster_nodes",
    "concurrent_capacity",
    "decide_concurrency",
    "grid_size",
    "param_space",
    "plot_trials",
    "throughput_metrics",
    "trial_report_callback",
    "trial_rows",
    "trial_scheduler",
    "write_trials_csv",
]

logger = logging.getLogger(__name__)

#: The kinds of distribution :func:`param_space` understands, each ``{kind: values}``.
DISTRIBUTION_KINDS: tuple[str, ...] = ("choice", "grid", "uniform", "loguniform", "randint")


def _kind_and_values(key: str, distribution: Mapping[str, Any]) -> tuple[str, Sequence[Any]]:
    given = [kind for kind in DISTRIBUTION_KINDS if distribution.get(kind) is not None]
    if len(given) != 1:
        raise ConfigError(
            f"search space entry {key!r} needs exactly one of {', '.join(DISTRIBUTION_KINDS)}; "
            f"got {', '.join(given) if given else 'none'}. Fix: write e.g. "
            "{'loguniform': [0.01, 0.2]} or {'choice': [16, 32]}."
        )
    return given[0], list(distribution[given[0]])


def param_space(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Ray Tune domains for a search space of plain distributions.

    Args:
        space: Parameter name (kept as is, e.g. dotted ``train.lr``) to one distribution
            ``{kind: values}``: ``choice``/``grid`` (values), ``uniform``/``loguniform``
            (``[low, high]`` floats) or ``randint`` (``[low, high]``, both ends included).

    Raises:
        ConfigError: An entry does not name exactly one known kind.
    """
    from ray import tune

    domains: dict[str, Any] = {}
    for key, distribution in space.items():
        kind, values = _kind_and_values(key, distribution)
        if kind == "choice":
            domains[key] = tune.choice(list(values))
        elif kind == "grid":
            domains[key] = tune.grid_search(list(values))
        elif kind == "uniform":
            domains[key] = tune.uniform(*values)
        elif kind == "loguniform":
            domains[key] = tune.loguniform(*values)
        else:
            low, high = values
            domains[key] = tune.randint(low, high + 1)  # Tune's upper bound is exclusive
    return domains


def grid_size(space: Mapping[str, Mapping[str, Any]]) -> int:
    """Grid points of a search space (product of its ``grid`` lengths; 1 without a grid)."""
    size = 1
    for distribution in space.values():
        if distribution.get("grid") is not None:
            size *= len(distribution["grid"])
    return size


def trial_scheduler(
    kind: str, *, max_epochs: int, grace_period: int = 1, reduction_factor: float = 2
) -> Any:
    """The Tune trial scheduler: ``"fifo"`` (every trial runs to the end) or ``"asha"``
    (early stopping per epoch, ``time_attr="training_iteration"``).

    Raises:
        ConfigError: ``kind`` is neither.
    """
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if kind == "fifo":
        return FIFOScheduler()
    if kind != "asha":
        raise ConfigError(f"unknown trial scheduler {kind!r}. Fix: use 'fifo' or 'asha'.")
    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=max_epochs,
        grace_period=min(grace_period, max_epochs),
        reduction_factor=reduction_factor,
    )
