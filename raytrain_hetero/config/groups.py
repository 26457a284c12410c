"""Run-wide setting groups of :class:`~raytrain_hetero.driver.trainer.HeteroTrainer`,
grouped like Ray's ``ScalingConfig``/``RunConfig`` (the re-planning policy's knobs live once,
in :class:`~raytrain_hetero.core.policy.PolicyConfig`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import Int, NonNegFloat, PositiveFloat, PositiveInt, invalid
from raytrain_hetero.config.specs import SlowdownInjection
from raytrain_hetero.core.policy import PolicyConfig

__all__ = [
    "BackendConfig",
    "BatchConfig",
    "ElasticConfig",
    "EmulationConfig",
    "GuardConfig",
    "PolicyConfig",
    "SchedulerConfig",
]


class BatchConfig(HeteroModel):
    """What one optimizer step consumes and how it is carved across the workers.

    Attributes:
        global_batch_size: Samples per optimizer step, summed over all workers.
        min_slice: Smallest slice any worker gets per step (>= 1: a rank with no data
            would deadlock DDP).
        weighting: ``"proportional"`` weights each rank's gradient by its sample count (the
            exact global-batch gradient); ``"uniform"`` averages them (the seed papers' HDP
            baseline, for comparisons only).
        batchnorm: ``"exact"`` replaces BatchNorm layers by global-batch-statistics
            :class:`~raytrain_hetero.worker.sync.batchnorm.exact.HeteroBatchNorm` (the one-device
            computation; two small collectives per layer per step); ``"local"`` keeps each
            rank's per-slice statistics (stock DDP's semantics: cheaper, but under uneven
            slices neither the normalisation, the gradients nor the running statistics are
            the one-device ones); ``"ghost"`` normalises contiguous groups of ``ghost_size``
            samples of the global batch, in carving order, by their own statistics
            (:class:`~raytrain_hetero.worker.sync.batchnorm.ghost.GhostBatchNorm`): slices are planned in
            whole groups, so the update is one device's ghost BatchNorm update whatever the
            split, with no exchange in the layers (running statistics: one all-reduce per
            step). See docs/concepts/ghost-batchnorm.md.
        ghost_size: Samples per ghost group (``batchnorm: ghost`` only; >= 2, and the
            global batch a multiple of it). Every slice is a multiple of it and at least one
            group.
        max_memory_fraction: Fraction of a worker's memory (CUDA: the device's total; CPU: the
            worker's Ray ``memory`` resource, else its share of the node's available RAM
            among the training workers there) that one
            forward+backward pass may use. The probe measures each worker's peak memory per
            sample and turns the budget into a cap in samples per pass; ``None``: no memory
            cap (only ``WorkerSpec.max_micro_batch`` caps a pass).
        memory_cap_mode: What a worker does with a slice above its per-pass cap:
            ``"accumulate"`` keeps the speed-proportional slice and runs it in micro-batches
            of at most the cap (loop: :func:`raytrain_hetero.micro_batches`), count-weighted,
            so the update stays exact (refused with exact BatchNorm, whose statistics span
            the whole slice); ``"slice"`` caps the slice in the allocation and spreads the
            rest over the other workers.
        fixed_shares: One relative share per worker slot (counts expanded, in order); skips
            probing and, by default, live re-planning.
        seed: Seed of the per-epoch permutations (and, in the YAML job, of the model init).
        step_workers: Workers the step boundaries are fixed for (``None``: every worker
            slot). A run whose workers change between fits (``tune.allocation: auto``) fixes
            it at the most it may hold, so it resumes exactly on any of them.
    """

    global_batch_size: PositiveInt = Field(description="samples per step over all workers")
    min_slice: PositiveInt = 1
    weighting: Literal["proportional", "uniform"] = "proportional"
    batchnorm: Literal["exact", "local", "ghost"] = "exact"
    ghost_size: Int = Field(32, ge=2)
    max_memory_fraction: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    memory_cap_mode: Literal["accumulate", "slice"] = "accumulate"
    fixed_shares: tuple[PositiveFloat, ...] | None = Field(None, min_length=1)
    seed: Int = Field(0, ge=0)
    step_workers: PositiveInt | None = None

    @model_validator(mode="after")
    def _whole_ghost_groups(self) -> BatchConfig:
        if self.batchnorm == "ghost" and self.global_batch_size % self.ghost_size:
            raise invalid(
                f"batchnorm: ghost needs the global batch in whole groups, but "
                f"global_batch_size {self.global_batch_size} is not a multiple of ghost_size "
                f"{self.ghost_size}",
                "make global_batch_size a multiple of ghost_size (or change ghost_size)",
                ("ghost_size",),
            )
        return self

    @property
    def slice_quantum(self) -> int:
        """Samples every slice is a multiple of: ``ghost_size`` under ghost BatchNorm, else 1."""
        return self.ghost_size if self.batchnorm == "ghost" else 1

    @property
    def min_slice_samples(self) -> int:
        """The smallest slice in samples: ``min_slice`` rounded up to whole groups."""
        quantum = self.slice_quantum
        return -(-self.min_slice // quantum) * quantum


def _policy_values(value: Any) -> Any:
    # pydantic's dataclass validation would read ``true`` as 1; refuse it as everywhere else.
    if isinstance(value, Mapping):
        hints = typing.get_type_hints(PolicyConfig)
        for name, given in value.items():
            if isinstance(given, bool) and hints.get(name) in (int, float):
                raise invalid(
                    f"expected a number, got {str(given).lower()}", "write a number here", (name,)
                )
    return value


class SchedulerConfig(HeteroModel):
    """Live re-planning from measured step times while training runs.

    Attributes:
        live: Re-plan from live measurements; ``None``: yes, unless ``fixed_shares`` is set.
        policy: When measured speeds justify a new plan (window, threshold, hysteresis,
            stragglers): :class:`~raytrain_hetero.core.policy.PolicyConfig`, or a mapping
            of its fields.
        plan_sync_every: Steps between the ranks' agreement on a pending plan (0: never).
        flush_every: Steps between pushes of per-step measurements to the scheduler actor;
            ``None``: every ``plan_sync_every`` steps (every step when plan sync is off).
    """

    live: bool | None = None
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    plan_sync_every: Int = Field(5, ge=0)
    flush_every: PositiveInt | None = None

    @field_validator("policy", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any) -> Any:
        return _policy_values(value)

    def resolved_live(self, batch: BatchConfig) -> bool:
        """Whether to re-plan live for ``batch``: ``live``, or ``None`` -> no fixed shares."""
        return batch.fixed_shares is None if self.live is None else self.live

    def resolved_flush_every(self) -> int:
        """Steps between measurement pushes (``flush_every`` with ``None`` resolved)."""
        return self.flush_every or max(self.plan_sync_every, 1)


class ElasticConfig(HeteroModel):
    """The group's size and room: Ray Train V2 elastic scaling between ``min_workers`` and
    all worker slots, and how long a run waits for the cluster to hold it.

    Attributes:
        min_workers: Smallest group to train with (``None``: fixed size). Slots fill in
            order, so list essential workers first.
        resize_monitor_interval_s: How often Ray Train looks for room to grow.
        placement_timeout_s: How long ``fit()`` waits, before asking Ray Train for a worker
            group, for the cluster to hold its first ``min_workers`` slots (all slots for a
            fixed group) when it may yet: an autoscaler can add nodes, or other work holds
            the resources. A progress line says what it waits for every 30 s; then the run
            fails naming the worker and what is missing. A group no node could ever hold
            fails at once, without waiting. Inside a Ray Tune trial the wait has no limit
            (the search's other trials hold the room and give it back).
        preemption_notice: Act on a node drain with a deadline (a spot preemption notice,
            read at the plan-sync steps): train on every worker to the last step that fits
            before the deadline, checkpoint there (the loop's ``checkpoint_due()``) and, in
            an elastic run, continue at once without the node. False: Ray Train's default
            (it waits out the deadline, then restarts from the last checkpoint).
            ``docs/reliability/preemption.md``.
        preemption_margin_s: Seconds kept free before the deadline beyond the predicted
            steps and checkpoint (clock skew, Ray Train's report round trip).
    """

    min_workers: PositiveInt | None = None
    resize_monitor_interval_s: PositiveFloat = 5.0
    placement_timeout_s: PositiveFloat = 900.0
    preemption_notice: bool = True
    preemption_margin_s: NonNegFloat = 3.0


class EmulationConfig(HeteroModel):
    """EMULATION for CPU-only tests and demos: slowdowns injected at given steps.

    Attributes:
        slowdowns: Each makes one worker (by name) or rank ``factor`` times slower from a
            step on.
        noise: Per-step noise: each training step, every worker's factor is multiplied by a
            draw uniform in ``[1 - noise, 1 + noise]`` (deterministic per worker and step,
            the same on every call within a step). A factor cannot go below 1 (emulation only
            slows down), so give base slowdowns >= ``1 / (1 - noise)`` for symmetric noise.
        node_slowdowns: ``{label key: {label value: factor}}``: a worker on a node whose
            label ``key`` has ``value`` is ``factor`` times slower (multiplied onto its
            ``emulated_slowdown``; several keys multiply; a node without the label: 1). The
            node decides, whatever the worker's name: emulates a cluster of unequal nodes
            where a worker may land on any of them (``benchmarks/tune_asha.py``).
    """

    slowdowns: tuple[SlowdownInjection, ...] = ()
    noise: NonNegFloat = Field(0.0, lt=1.0)
    node_slowdowns: dict[str, dict[str, Annotated[float, Field(ge=1.0, allow_inf_nan=False)]]] = (
        Field(default_factory=dict)
    )


class BackendConfig(HeteroModel):
    """The torch process group.

    Attributes:
        torch_backend: Force ``"gloo"`` or ``"nccl"``; ``None``: nccl iff every worker is on
            CUDA, else gloo.
        collective_timeout_s: A rank stuck this long in a collective fails the group, which
            Ray Train restarts (``RunConfig(failure_config=...)``).
    """

    torch_backend: Literal["gloo", "nccl"] | None = None
    collective_timeout_s: PositiveInt = 1800


class GuardConfig(HeteroModel):
    """The step guard of :func:`raytrain_hetero.prepare_optimizer`.

    A step whose gradients are non-finite on any rank is skipped on every rank (no update,
    no momentum, no weight decay) and counted.

    Attributes:
        max_consecutive_nonfinite: After this many consecutive skipped steps the run stops
            with :class:`~raytrain_hetero.errors.NonFiniteStepError` naming the step and rank.
    """

    max_consecutive_nonfinite: PositiveInt = 3
