"""The step guard: a step whose gradients are non-finite on any rank is skipped on every rank.

One rank's NaN or inf gradient, summed by the weighted all-reduce, would poison every rank's
parameters. The guard decides per step, identically on every rank, whether the optimizer may
apply the step:

* The DDP communication hook (:mod:`raytrain_hetero.worker.ddp`) checks each gradient bucket
  of this rank *before* the reduction (:meth:`StepGuard.check_bucket`) and appends a
  per-rank indicator (one element per rank, 1 where that rank's gradients were non-finite) to
  the last bucket's all-reduce. The flag thus rides on a collective that happens anyway: no
  extra rendezvous, and after the reduction every rank knows *which* ranks were non-finite.
* Where no flag rode along (a model not prepared by ``prepare_model``, or gradients not
  synchronised through DDP), :meth:`StepGuard.verdict` checks the optimizer's gradients
  locally and runs one tiny all-reduce of the same indicator.

:func:`guard_optimizer` replaces ``optimizer.step`` on the optimizer itself (the object stays
the user's optimizer, so LR schedulers, ``state_dict`` and ``torch.amp.GradScaler`` keep
working): a skipped step calls nothing, so no update, momentum or weight decay is applied.
With ``GradScaler``, a step the scaler finds non-finite never reaches ``optimizer.step``:
overflow handling stays the scaler's and does not count toward the consecutive limit.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.errors import NonFiniteStepError

logger = logging.getLogger(__name__)

__all__ = ["GuardVerdict", "StepGuard", "guard_optimizer", "optimizer_gradients"]

_GUARDED = "_raytrain_hetero_guarded"


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
        rank: This rank.
        world_size: Ranks in the group.
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

    # ------------------------------------------------------------------ inside the DDP hook

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

    # ------------------------------------------------------------------ at optimizer.step

    def verdict(
        self, step: int, gradients: Callable[[], Iterable[torch.Tensor]], group: Any = None
    ) -> GuardVerdict:
        """Decide ``step`` (a collective only when no indicator rode on the gradient sync).

        Args:
            step: Global step about to be applied.
            gradients: This rank's gradients (for the fallback check).
            group: Process group of the fallback all-reduce (default: the world).

        Raises:
            NonFiniteStepError: The step is the ``max_consecutive``-th skipped in a row.
        """
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


def guard_optimizer(
    optimizer: torch.optim.Optimizer, should_skip: Callable[[torch.optim.Optimizer], bool]
) -> torch.optim.Optimizer:
    """Make ``optimizer.step`` ask ``should_skip`` first; returns the same optimizer.

    ``step`` stays a bound method (LR schedulers rebind ``step.__func__``). A skipped step
    returns None without calling the optimizer, so its state (momentum, Adam moments, step
    counts) is untouched. Guarding twice is a no-op.
    """
    if getattr(optimizer, _GUARDED, False):
        return optimizer
    original = optimizer.step

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if should_skip(self):
            return None
        return original(*args, **kwargs)

    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    setattr(optimizer, _GUARDED, True)
    return optimizer
