"""How a Tune search shares the cluster's workers between its trials (issue 34).

``fixed`` (the default) is the search as it always was: every trial asks for the job's whole
``workers:`` list. ``auto``: the job's workers are worker *types*, and the search's allocator
(:mod:`raytrain_hetero.tune.allocator`) decides which workers each live trial holds
(:func:`raytrain_hetero.core.trial_allocation.decide_trial_allocation`); a trial whose
holdings change checkpoints at its next epoch end and resumes on its new workers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import Float, NonNegFloat, PositiveInt

__all__ = ["ALLOCATION_MODES", "AllocationMode", "TrialAllocatorConfig"]

#: ``fixed``: every trial gets the whole worker list; ``auto``: the allocator decides.
AllocationMode = Literal["auto", "fixed"]
ALLOCATION_MODES: tuple[str, ...] = ("auto", "fixed")


class TrialAllocatorConfig(HeteroModel):
    """Settings of the allocator of ``allocation: auto``.

    Attributes:
        max_workers_per_trial: Most workers one trial holds (None: no cap).
        min_gain_s: Keep the current holdings unless a change ends the search at least this
            many seconds sooner (hysteresis).
        restart_s: Seconds a change of a trial's workers costs it (checkpoint, new worker
            group, restore), charged to every change. None (the default): measured, the
            median start (a fit's call to its first step) of the fits that resumed a trial
            on new workers; before one is in, the quickest measured first start of a trial;
            30 s before any. A number: that charge, always (trusted: no error margin on it).
        max_start_slowdown: A new trial waits rather than start on a worker this many times
            slower than one worker of its fastest type.
        wait_poll_s: Seconds between a waiting trial's questions to the allocator.
    """

    max_workers_per_trial: PositiveInt | None = None
    min_gain_s: NonNegFloat = 0.0
    restart_s: NonNegFloat | None = None
    max_start_slowdown: Float = Field(8.0, ge=1.0, allow_inf_nan=False)
    wait_poll_s: Float = Field(0.5, gt=0, allow_inf_nan=False)
