"""The step guard: a step whose gradients are non-finite on any rank is skipped on every rank.

One rank's NaN or inf gradient, summed by the weighted all-reduce, would poison every rank's
parameters. The DDP hook checks each bucket before the reduction and appends a per-rank
indicator to the last bucket's all-reduce (no extra rendezvous; afterwards every rank knows
*which* ranks were non-finite); without a flag (no DDP sync) :meth:`StepGuard.verdict` checks
locally and runs one tiny all-reduce.

The decision is applied through torch's global optimizer step hooks, so it covers any
optimizer over a prepared model's parameters. A skipped step runs with every gradient set
aside (``None``): no update, momentum, moment, step count or weight decay changes; the
optimizer stays the user's, so LR schedulers, ``state_dict`` and ``GradScaler`` keep working
(a step the scaler finds non-finite never reaches ``optimizer.step`` and does not count).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from raytrain_hetero.errors import NonFiniteStepError

logger = logging.getLogger(__name__)

__all__ = ["GuardVerdict", "StepGuard", "install_step_hooks", "optimizer_gradients"]

_GUARDED = "_raytrain_hetero_guarded"  # set on an optimizer by prepare_optimizer
_SET_ASIDE = "_raytrain_hetero_set_aside"  # a skipped step's gradients, until its post hook
_should_skip: Callable[[torch.optim.Optimizer], bool] | None = None


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's decision for one step (identical on every rank).

    Attributes:
        step: Global step decided on.
        ranks: Ranks whose gradients were non-finite (empty: the step is applied).
        consecutive: Consecutive skipped steps up to and including this one.
    """

    step: int
    ranks: tuple[int, ...]
    consecutive: int

    @property
    def skip(self) -> bool:
        """True when the step must not be applied."""
        return bool(self.ranks)


class StepGuard:
    """Per-worker state of the step guard.

    Args:
        max_consecutive: Consecutive skipped steps after which :meth:`verdict` raises.
    """

    def __init__(self, rank: int, world_size: int, max_consecutive: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.skipped_total = 0
        self.first_skipped_step: int | None = None
        self._local_step: int | None = None
        self._local_bad: torch.Tensor | None = None
        self._flags_step: int | None = None
        self._flags: torch.Tensor | None = None
        self._decided: GuardVerdict | None = None
        self._watched: set[int] = set()

    def watch(self, parameters: Iterable[torch.Tensor]) -> None:
        """Guard every optimizer that steps any of ``parameters`` (a prepared model's)."""
        self._watched.update(id(p) for p in parameters)

    @staticmethod
    def mark(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Guard ``optimizer`` whatever it steps (``prepare_optimizer``); returns it."""
        setattr(optimizer, _GUARDED, True)
        return optimizer

    def covers(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the guard decides ``optimizer``'s steps."""
        if getattr(optimizer, _GUARDED, False):
            return True
        return any(id(p) in self._watched for g in optimizer.param_groups for p in g["params"])

    def check_bucket(self, step: int, bucket: torch.Tensor) -> None:
        """Note whether this rank's (pre-reduction) gradient bucket of ``step`` is finite."""
        bad = torch.logical_not(torch.isfinite(bucket).all())
        if self._local_step != step or self._local_bad is None:
            self._local_step, self._local_bad = step, bad
        else:
            self._local_bad = torch.logical_or(self._local_bad, bad)

    def indicator(self, step: int, like: torch.Tensor) -> torch.Tensor:
        """This rank's indicator for ``step`` (one element per rank), shaped to ride on ``like``."""
        flags = torch.zeros(self.world_size, dtype=like.dtype, device=like.device)
        if self._local_step == step and self._local_bad is not None:
            flags[self.rank] = self._local_bad.to(device=like.device, dtype=like.dtype)
        return flags

    def receive(self, step: int, reduced_flags: torch.Tensor) -> None:
        """Keep the all-reduced indicator of ``step`` (every rank's flag)."""
        self._flags_step, self._flags = step, reduced_flags
        self._decided = None  # a new backward in the same step is decided afresh

    def verdict(
        self, step: int, gradients: Callable[[], Iterable[torch.Tensor]], group: Any = None
    ) -> GuardVerdict:
        """Decide ``step`` (a collective only when no indicator rode on the gradient sync).

        ``gradients`` (this rank's) and ``group`` serve the fallback check. Every optimizer
        stepping in ``step`` gets the first decision (no second collective).

        Raises:
            NonFiniteStepError: The step is the ``max_consecutive``-th skipped in a row.
        """
        if self._decided is not None and self._decided.step == step:
            return self._decided
        self._decided = self._decide(step, gradients, group)
        return self._decided

    def _decide(
        self, step: int, gradients: Callable[[], Iterable[torch.Tensor]], group: Any
    ) -> GuardVerdict:
        if self._flags_step == step and self._flags is not None:
            flags = self._flags
        else:
            flags = self._fallback_flags(gradients(), group)
        ranks = tuple(r for r, value in enumerate(flags.tolist()) if value != 0)
        self._flags_step = self._flags = None
        if not ranks:
            self.consecutive = 0
            self.first_skipped_step = None
            return GuardVerdict(step, (), 0)
        self.consecutive += 1
        self.skipped_total += 1
        if self.first_skipped_step is None:
            self.first_skipped_step = step
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteStepError(
                f"{self.consecutive} consecutive optimizer steps had non-finite gradients "
                f"(steps {self.first_skipped_step}..{step}); at step {step} they came from "
                f"rank(s) {list(ranks)}. Every one was skipped on all ranks, so the model is "
                "still the last finite one. Fix: check those ranks' data and loss for NaN/inf, "
                "lower the learning rate or clip gradients; guard.max_consecutive_nonfinite "
                f"(now {self.max_consecutive}) sets how many skipped steps in a row are "
                "tolerated."
            )
        return GuardVerdict(step, ranks, self.consecutive)

    def _fallback_flags(self, gradients: Iterable[torch.Tensor], group: Any) -> torch.Tensor:
        grads = [g for g in gradients if g is not None]
        bad = any(not bool(torch.isfinite(g).all()) for g in grads)
        flags = torch.zeros(self.world_size, dtype=torch.float32)
        flags[self.rank] = 1.0 if bad else 0.0
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            backend = dist.get_backend(group)
            if backend == dist.Backend.NCCL:
                flags = flags.cuda()
            dist.all_reduce(flags, group=group)
        return flags.cpu()


def optimizer_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer would apply."""
    return [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]


def install_step_hooks(should_skip: Callable[[torch.optim.Optimizer], bool]) -> None:
    """Make every ``optimizer.step`` of this process ask ``should_skip`` first.

    torch's global step hooks, registered once per process (``should_skip`` is replaced on a
    later call): a step ``should_skip`` refuses runs with its gradients set aside, a no-op
    for torch's optimizers, which update only parameters that have a gradient.
    """
    global _should_skip
    if _should_skip is None:
        register_optimizer_step_pre_hook(_set_gradients_aside)
        register_optimizer_step_post_hook(_restore_gradients)
    _should_skip = should_skip


def _set_gradients_aside(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if _should_skip is None or not _should_skip(optimizer):
        return
    aside = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    setattr(optimizer, _SET_ASIDE, [(p, p.grad) for p in aside])
    for p in aside:
        p.grad = None


def _restore_gradients(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for p, grad in optimizer.__dict__.pop(_SET_ASIDE, ()):
        p.grad = grad
