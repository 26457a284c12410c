"""Ray Tune searches over HeteroTrainer runs: search distributions, domains, trial scheduler.

A library-level integration that knows nothing of the YAML job: the pieces are
:mod:`~raytrain_hetero.tune.trial` (the report callback and the clean stop of a trial's Train
run), :mod:`~raytrain_hetero.tune.capacity` (how many trials run at once),
:mod:`~raytrain_hetero.tune.results` (rows, plot) and, here, :class:`SearchDistribution` (the
YAML job's ``tune.search_space`` values), :func:`param_space` and :func:`trial_scheduler`.
The search over a YAML job (``raytrain-hetero tune``) is :mod:`raytrain_hetero.app.tune_job`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import Float, Int, PositiveFloat, invalid
from raytrain_hetero.errors import ConfigError

__all__ = [
    "DISTRIBUTION_KINDS",
    "SearchDistribution",
    "grid_size",
    "param_space",
    "trial_scheduler",
]

#: The kinds of distribution, each written ``{kind: values}``.
DISTRIBUTION_KINDS: tuple[str, ...] = ("choice", "grid", "uniform", "loguniform", "randint")


class SearchDistribution(HeteroModel):
    """How one hyperparameter is drawn; exactly one key is set.

    Attributes:
        choice: Draw one of these values at random per trial.
        grid: Try every value (each grid point runs ``num_samples`` times).
        uniform: ``[low, high]``: a float drawn uniformly.
        loguniform: ``[low, high]`` with ``0 < low``: a float drawn uniformly in log space.
        randint: ``[low, high]``: an integer drawn uniformly, both ends included.
    """

    choice: list[Any] | None = Field(None, min_length=1)
    grid: list[Any] | None = Field(None, min_length=1)
    uniform: list[Float] | None = Field(None, min_length=2, max_length=2)
    loguniform: list[PositiveFloat] | None = Field(None, min_length=2, max_length=2)
    randint: list[Int] | None = Field(None, min_length=2, max_length=2)

    @model_validator(mode="after")
    def _exactly_one(self) -> SearchDistribution:
        given = [kind for kind in DISTRIBUTION_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise invalid(
                f"a distribution needs exactly one of {', '.join(DISTRIBUTION_KINDS)}; "
                f"got {', '.join(given) if given else 'none'}",
                "write e.g. {loguniform: [0.01, 0.2]} or {choice: [16, 32]}",
            )
        kind = given[0]
        if kind in ("uniform", "loguniform", "randint"):
            low, high = getattr(self, kind)
            if not low < high:
                raise invalid(
                    f"{kind} needs low < high, got [{low}, {high}]",
                    "write the smaller bound first, or use choice: [value] for a constant",
                    (kind,),
                )
        return self

    @property
    def kind(self) -> str:
        """Which distribution this is (``"choice"``, ``"loguniform"``, ...)."""
        return next(kind for kind in DISTRIBUTION_KINDS if getattr(self, kind) is not None)

    def candidate_values(self) -> list[Any]:
        """Values worth checking against the job: every listed value, or both bounds."""
        return list(getattr(self, self.kind))


def _distributions(
    space: Mapping[str, SearchDistribution | Mapping[str, Any]],
) -> dict[str, SearchDistribution]:
    return {
        key: d if isinstance(d, SearchDistribution) else SearchDistribution(**d)
        for key, d in space.items()
    }


def param_space(space: Mapping[str, SearchDistribution | Mapping[str, Any]]) -> dict[str, Any]:
    """Ray Tune domains for a search space: parameter name (kept as is, e.g. dotted ``train.lr``)
    to a :class:`SearchDistribution` or a mapping of its fields.

    Raises:
        ConfigError: A mapping is not a valid distribution.
    """
    from ray import tune

    domains: dict[str, Any] = {}
    for key, distribution in _distributions(space).items():
        kind, values = distribution.kind, distribution.candidate_values()
        if kind == "choice":
            domains[key] = tune.choice(values)
        elif kind == "grid":
            domains[key] = tune.grid_search(values)
        elif kind == "uniform":
            domains[key] = tune.uniform(*values)
        elif kind == "loguniform":
            domains[key] = tune.loguniform(*values)
        else:
            low, high = values
            domains[key] = tune.randint(low, high + 1)  # Tune's upper bound is exclusive
    return domains


def grid_size(space: Mapping[str, SearchDistribution | Mapping[str, Any]]) -> int:
    """Grid points of a search space (product of its ``grid`` lengths; 1 without a grid)."""
    size = 1
    for distribution in _distributions(space).values():
        size *= len(distribution.grid or [None])
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
