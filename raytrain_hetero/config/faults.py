"""FAULT INJECTION (test and ops tooling): which faults to inject into a run, and where.

Active only when a :class:`FaultInjectionConfig` with faults is passed to
:class:`~raytrain_hetero.driver.trainer.HeteroTrainer` (``faults=``); deliberately not a YAML
key: it proves the fault tolerance (tests, ``benchmarks/soak.py``) and must not be left on in
a job file. Each fault fires at most once per run, although the worker group restarts
(:mod:`raytrain_hetero.worker.setup.faults`).
"""

from __future__ import annotations

import random
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.checks import _slowdown_problems
from raytrain_hetero.config.fields import Int, PositiveFloat, invalid
from raytrain_hetero.config.problems import raise_if_any
from raytrain_hetero.config.specs import WorkerSpec

__all__ = [
    "ACTIONS",
    "PHASES",
    "STEP_PHASES",
    "FaultInjectionConfig",
    "FaultSpec",
    "check_fault_targets",
    "random_faults",
]

Phase = Literal["probe", "calibration", "plan_switch", "mid_epoch", "checkpoint_commit"]
Action = Literal["kill", "hang", "nan", "kill_scheduler", "corrupt_state"]

#: Every phase, in the order a worker group meets them.
PHASES: tuple[str, ...] = typing.get_args(Phase)
#: Phases that happen at a training step (a fault there may name the step).
STEP_PHASES: tuple[str, ...] = ("plan_switch", "mid_epoch", "checkpoint_commit")
ACTIONS: tuple[str, ...] = typing.get_args(Action)


class FaultSpec(HeteroModel):
    """One fault: at ``phase`` (and ``step``), the targeted rank does ``action``, once per run.

    Phases (where the hook sits):

    * ``probe``: the rank starts its throughput probe;
    * ``calibration``: the rank starts its calibration steps;
    * ``plan_switch``: a plan agreed during training (``update_plan`` or a live re-plan) is
      about to be installed; ``step`` is the step after which the switch was agreed;
    * ``mid_epoch``: the rank has finished global step ``step`` (its optimizer update) and
      has not started the next one; no report of that step has happened unless the loop
      reported inside the step;
    * ``checkpoint_commit``: in ``report(..., checkpoint=...)`` after the checkpoint state
      was written and before ``ray.train.report`` hands the checkpoint to Ray Train;
      ``step`` is the last global step run.

    Actions: ``kill`` (SIGKILL of the worker process itself, like ``kill -9``), ``hang``
    (block for ``hang_s`` before the rank's next collective, so the others time out in it),
    ``nan`` (this rank's gradients become NaN in the step's all-reduce; ``mid_epoch`` only,
    the step after ``step``), ``kill_scheduler`` (``ray.kill`` of the run's scheduler actor,
    which Ray restarts) and ``corrupt_state`` (``checkpoint_commit`` only: the checkpoint's
    state file is overwritten with bytes that are not JSON).

    Attributes:
        phase: Where the fault fires.
        action: What happens there.
        step: For ``plan_switch``, ``mid_epoch`` and ``checkpoint_commit``, the global step
            (``None``: the first time the phase is reached); must be ``None`` for ``probe``
            and ``calibration`` (they fire the first time the rank gets there).
        worker: WorkerSpec name of the target (counts expanded: ``name-i``), or
        rank: the target's world rank (exactly one of the two).
        hang_s: How long ``hang`` blocks (longer than the collective timeout, so the group
            fails; the hung process is ended with its group).
    """

    phase: Phase = Field(description="where the fault fires")
    action: Action = Field(description="what the targeted rank does there")
    step: Int | None = Field(None, ge=0)
    worker: str | None = None
    rank: Int | None = Field(None, ge=0)
    hang_s: PositiveFloat = 600.0

    @model_validator(mode="after")
    def _consistent(self) -> FaultSpec:
        if (self.worker is None) == (self.rank is None):
            raise invalid(
                "a fault targets exactly one of worker= or rank=",
                "set worker: <WorkerSpec name> or rank: <world rank>, not both",
            )
        if self.step is not None and self.phase not in STEP_PHASES:
            raise invalid(
                f"phase {self.phase!r} happens before training steps, so it has no step",
                f"remove step, or use one of {', '.join(STEP_PHASES)}",
                ("step",),
            )
        if self.action == "nan" and self.phase != "mid_epoch":
            raise invalid(
                f"action 'nan' poisons a training step's gradients, not the {self.phase!r} phase",
                "use phase: mid_epoch",
                ("action",),
            )
        if self.action == "corrupt_state" and self.phase != "checkpoint_commit":
            raise invalid(
                "action 'corrupt_state' corrupts a checkpoint's state file as it is written",
                "use phase: checkpoint_commit",
                ("action",),
            )
        return self

    def targets(self, worker: str, rank: int) -> bool:
        """Whether this fault targets the worker named ``worker`` at world rank ``rank``."""
        return self.rank == rank if self.worker is None else self.worker == worker

    def describe(self) -> str:
        """One line for logs: ``kill rank 1 at mid_epoch step 5``."""
        target = f"rank {self.rank}" if self.worker is None else f"worker {self.worker!r}"
        where = self.phase if self.step is None else f"{self.phase} step {self.step}"
        return f"{self.action} {target} at {where}"


class FaultInjectionConfig(HeteroModel):
    """FAULT INJECTION (test/ops tooling): the faults of a run and where firings are recorded.

    Attributes:
        faults: The faults, each fired at most once per run.
        marker_dir: Directory every worker can write (shared storage on a multi-node
            cluster) where each firing leaves a marker file. Required when ``faults`` is
            not empty; use a fresh directory per run.
    """

    faults: tuple[FaultSpec, ...] = ()
    marker_dir: Path | None = None

    @model_validator(mode="after")
    def _marker_dir_given(self) -> FaultInjectionConfig:
        if self.faults and self.marker_dir is None:
            raise invalid(
                "faults are configured but marker_dir is missing: a fault must fire once per "
                "run although the worker group restarts, which only a marker on disk survives",
                "set marker_dir to a fresh directory every worker can write",
                ("marker_dir",),
            )
        return self

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        return bool(self.faults)


def check_fault_targets(
    config: FaultInjectionConfig, slots: Sequence[WorkerSpec]
) -> FaultInjectionConfig:
    """``config`` if every fault targets one of the worker ``slots`` (counts expanded).

    Raises:
        ConfigError: A fault names an unknown worker or a rank outside the world.
    """
    names = [s.name for s in slots]
    # The same target rule as an emulated slowdown's (worker name or rank).
    problems = [
        problem
        for i, fault in enumerate(config.faults)
        for problem in _slowdown_problems(fault, names, ("faults", "faults", i))  # type: ignore[arg-type]
    ]
    raise_if_any(problems, "HeteroTrainer")
    return config


def random_faults(
    seed: int,
    count: int,
    *,
    steps: int,
    world_size: int,
    actions: Sequence[str] = ("kill",),
    phases: Sequence[str] = ("mid_epoch", "checkpoint_commit"),
    checkpoint_every: int = 1,
    switch_steps: Sequence[int] = (),
    hang_s: float = 600.0,
) -> tuple[FaultSpec, ...]:
    """``count`` seeded, reproducible random faults for a soak run: an action of ``actions`` at
    a phase of ``phases`` on a rank below ``world_size``. ``checkpoint_commit`` faults land
    after a checkpointing step (``(s + 1) % checkpoint_every == 0``); ``mid_epoch`` ones before
    the last of ``steps`` and, where there are others, not after a checkpointing step (the
    loop reported first there, so a restart resumes after it and only the first of several
    faults there could fire); ``plan_switch`` ones at ``switch_steps``; a ``hang`` blocks
    ``hang_s``.
    """
    rng = random.Random(seed)
    checkpoint_steps = [s for s in range(steps) if (s + 1) % checkpoint_every == 0]
    recurring = [s for s in range(steps - 1) if s not in checkpoint_steps]
    step_choices: dict[str, Sequence[int]] = {
        "mid_epoch": recurring or range(steps - 1),
        "checkpoint_commit": checkpoint_steps,
        "plan_switch": list(switch_steps),
    }
    faults = []
    for _ in range(count):
        phase = rng.choice(list(phases))
        action = rng.choice(list(actions))
        choices = step_choices.get(phase)
        if choices is not None and not choices:
            raise ValueError(f"no step to place a {phase!r} fault at")
        faults.append(
            FaultSpec(
                phase=phase,  # type: ignore[arg-type]
                action=action,  # type: ignore[arg-type]
                step=rng.choice(list(choices)) if choices is not None else None,
                rank=rng.randrange(world_size),
                hang_s=hang_s,
            )
        )
    return tuple(faults)
