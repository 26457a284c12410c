"""A search's early stops, recorded once and replayed: the same work for every contender.

ASHA decides asynchronously: a trial stops at a rung if its score is below the top ``1/eta``
of the scores *recorded there before it*, so its decisions depend on the order in which trials
reach their rungs, and that order depends on how the trials were given workers. Two searches
with the same seed, space and scores can then run different trials for different epochs (up
to 60 % more epochs in one of issue 34's runs), and their makespans compare two searches, not
two allocations. Making each score a deterministic function of (configuration, epoch) does
not remove that: the order still differs. So a comparison of allocations replays one
search's stops: :class:`PromotionSchedule` is the epochs each trial ran (in the search's
sample order, with the configurations to check against), and :class:`PromotionReplay` is a
Tune trial scheduler that stops trial ``i`` after exactly ``epochs[i]`` epochs, whatever the
order or the scores. The allocator still plans as under ASHA (it knows the promotion
probabilities, not the draw).

Trials are matched by their index in the search's sample order (Tune's trial id ends in it,
``<prefix>_<index:05d>``; a seeded ``BasicVariantGenerator`` draws the same configurations in
the same order), and each trial's configuration is checked against the recorded one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.errors import ConfigError

__all__ = ["PromotionReplay", "PromotionSchedule", "trial_index"]


def trial_index(trial_id: str) -> int:
    """A trial's index in its search's sample order (Tune's ids end in ``_<index:05d>``).

    Raises:
        ConfigError: The id does not end in an index.
    """
    tail = str(trial_id).rsplit("_", 1)[-1]
    if not tail.isdigit():
        raise ConfigError(
            f"trial id {trial_id!r} does not end in its sample index (_00000); replay a "
            "search run with Tune's BasicVariantGenerator"
        )
    return int(tail)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


@dataclass(frozen=True)
class PromotionSchedule:
    """The epochs each trial of a recorded search ran, in its sample order.

    Attributes:
        epochs: Per trial, the epochs it ran before the trial scheduler stopped it (the
            search's ``max_t`` for a trial that completed).
        configs: Per trial, the searched values it ran with (``{"train.lr": ...}``), to
            check the replayed search draws the same; empty: unchecked.
        source: Where it was recorded (a path and contender, or a command).
    """

    epochs: tuple[int, ...]
    configs: tuple[Mapping[str, Any], ...] = field(default=())
    source: str = ""

    def __post_init__(self) -> None:
        if not self.epochs or any(int(e) < 1 for e in self.epochs):
            raise ConfigError(
                f"a promotion schedule needs at least one trial and >= 1 epoch per trial, "
                f"got {list(self.epochs)}; record it from a search that ran"
            )
        if self.configs and len(self.configs) != len(self.epochs):
            raise ConfigError(
                f"a promotion schedule has {len(self.epochs)} trials' epochs but "
                f"{len(self.configs)} configurations; record both from one search"
            )

    def check(self, index: int, config: Mapping[str, Any]) -> None:
        """Raise unless trial ``index`` exists and ran with the recorded values.

        Raises:
            ConfigError: One line naming the trial and the first value that differs.
        """
        if not 0 <= index < len(self.epochs):
            raise ConfigError(
                f"the replayed search has trial {index} but the schedule ({self.source}) "
                f"records {len(self.epochs)} trials; run as many trials as it records"
            )
        if not self.configs:
            return
        for key, value in self.configs[index].items():
            if key in config and not _same(config[key], value):
                raise ConfigError(
                    f"trial {index} drew {key}={config[key]!r} but the schedule "
                    f"({self.source}) recorded {value!r}: replay it with the recorded "
                    "search's seed and space"
                )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (:meth:`from_dict` reads it)."""
        return {
            "epochs": list(self.epochs),
            "configs": [dict(c) for c in self.configs],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromotionSchedule:
        """The schedule :meth:`to_dict` wrote."""
        return cls(
            tuple(int(e) for e in data["epochs"]),
            tuple(dict(c) for c in data.get("configs") or ()),
            str(data.get("source", "")),
        )

    def save(self, path: str | Path) -> Path:
        """Write it as JSON."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PromotionSchedule:
        """Read a schedule :meth:`save` wrote."""
        return cls.from_dict(json.loads(Path(path).read_text()))


class PromotionReplay(FIFOScheduler):
    """A Tune trial scheduler that stops trial ``i`` after ``schedule.epochs[i]`` epochs.

    Trials start in order as under FIFO; each result whose ``time_attr`` reached the trial's
    recorded epochs stops it (as ASHA stopped it in the recorded search, at the same report);
    a trial recorded as complete runs to its end. Checks each trial's configuration when Tune
    adds it.
    """

    def __init__(
        self, schedule: PromotionSchedule, *, time_attr: str = "training_iteration"
    ) -> None:
        super().__init__()
        self.schedule = schedule
        self.time_attr = time_attr
        self.stopped: dict[str, int] = {}

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self.schedule.check(trial_index(trial.trial_id), dict(trial.config or {}))
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        budget = self.schedule.epochs[trial_index(trial.trial_id)]
        done = int(result.get(self.time_attr, 0) or 0)
        if done >= budget:
            self.stopped[trial.trial_id] = done
            return str(TrialScheduler.STOP)
        return str(TrialScheduler.CONTINUE)

    def debug_string(self) -> str:
        return f"PromotionReplay: {len(self.schedule.epochs)} trials ({self.schedule.source})"
