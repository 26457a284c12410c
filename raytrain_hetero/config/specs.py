"""Worker groups, probing and emulated slowdowns: the per-worker library config objects."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import (
    Float,
    Int,
    NonNegFloat,
    PositiveInt,
    check_name,
    invalid,
)
from raytrain_hetero.config.problems import raise_validation_error
from raytrain_hetero.errors import ConfigError

__all__ = [
    "NODE_ID_LABEL",
    "ProbeConfig",
    "SlowdownInjection",
    "WorkerSpec",
    "expand_worker_specs",
    "worker_groups",
]

#: The label Ray 2.60 gives every node, with its node id as value (seen in ``ray.nodes()``;
#: ``ray.util.placement_group.NODE_ID_LABEL_KEY``): a selector on it pins a worker to a node.
NODE_ID_LABEL = "ray.io/node-id"


class WorkerSpec(HeteroModel):
    """One group of identical workers.

    Attributes:
        name: Group name (letters, digits, ``_ . -``); workers of a group with ``count > 1``
            are named ``<name>-0``, ``<name>-1``, ... (see :func:`expand_worker_specs`).
        count: Number of identical workers in the group.
        resources: Ray resources each worker of the group requests (must include ``CPU > 0``).
        label_selector: Ray node labels a worker must land on (``None``: anywhere).
        device: ``"auto"`` uses CUDA iff ``resources`` requests a GPU.
        max_batch: Per-step slice cap (memory bound), or ``None`` for no cap.
        max_micro_batch: Samples one forward+backward pass of this worker may hold (an
            explicit memory cap, combined with the probe's cap from
            ``BatchConfig.max_memory_fraction`` by the minimum); a larger slice runs in
            micro-batches or is capped (``BatchConfig.memory_cap_mode``). ``None``: no
            explicit cap.
        emulated_slowdown: EMULATION for CPU-only testing and demos: stretches this worker's
            own compute time by this factor (``1.0`` = real speed).
        emulated_collective_delay_s: EMULATION of a worker behind a slow link: it sleeps this
            long before every gradient all-reduce it joins (each DDP bucket, and the probe's
            timed all-reduce), so the whole group waits for it in every collective.
    """

    name: str = Field(description="worker group name")
    count: PositiveInt = 1
    resources: dict[str, NonNegFloat] = Field(default_factory=lambda: {"CPU": 1.0})
    label_selector: dict[str, str] | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch: PositiveInt | None = None
    max_micro_batch: PositiveInt | None = None
    emulated_slowdown: Float = Field(1.0, ge=1.0, allow_inf_nan=False)
    emulated_collective_delay_s: NonNegFloat = 0.0

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_name(value, "worker name")

    @field_validator("resources")
    @classmethod
    def _valid_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if not key.strip():
                raise invalid(
                    "resource names must be non-empty",
                    "use Ray resource names such as CPU, GPU or a custom resource name",
                )
        if value.get("CPU", 0.0) <= 0:
            raise invalid(
                f"a worker needs CPU > 0, got resources {value}",
                "add CPU: 1 (or more) to resources",
                ("CPU",) if "CPU" in value else (),
            )
        return value

    @model_validator(mode="after")
    def _device_matches_resources(self) -> WorkerSpec:
        gpu = self.resources.get("GPU", 0.0)
        at: tuple[str | int, ...]
        if self.device == "cuda" and gpu <= 0:
            raise invalid(
                f"worker group {self.name!r} has device 'cuda' but requests no GPU, so Ray "
                "would place it without one",
                "add resources: {GPU: 1} (keep CPU), or set device: cpu",
                ("device",),
            )
        if self.resolved_device() == "cuda":
            at = ("resources", "GPU")
            if gpu < 1:
                raise invalid(
                    f"worker group {self.name!r} requests a fractional GPU ({gpu:g}) for a CUDA "
                    "worker; Ray would then pack several workers onto one GPU, where they "
                    "compete for it and no two workers may share a device",
                    "use resources: {GPU: 1}, or device: cpu for a CPU worker",
                    at,
                )
            if gpu > 1:
                raise invalid(
                    f"worker group {self.name!r} requests {gpu:g} GPUs per worker, but each "
                    "worker drives exactly one GPU, so the others would sit idle",
                    f"use resources: {{GPU: 1}} with count: {self.count * math.ceil(gpu)} "
                    "to run one worker per GPU",
                    at,
                )
        return self

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """The device this worker trains on: ``device``, with ``"auto"`` resolved.

        Returns:
            ``"cuda"`` if ``device == "cuda"``, or ``device == "auto"`` and ``resources``
            requests a GPU; otherwise ``"cpu"``.
        """
        if self.device == "auto":
            return "cuda" if self.resources.get("GPU", 0.0) > 0 else "cpu"
        return self.device

    def worker_type(self) -> dict[str, Any]:
        """What makes two workers the same type (as JSON): the spec but its name, count and
        caps, and but a pin to one node (``NODE_ID_LABEL``; nodes of a type are alike)."""
        about = self.model_dump(mode="json", exclude={"name", "count", "max_batch"})
        selector = dict(about.get("label_selector") or {})
        selector.pop(NODE_ID_LABEL, None)
        about["label_selector"] = selector or None
        return about

    def remote_options(self) -> dict[str, Any]:
        """Ray ``.options()`` of a task or actor placed as this worker (resources, labels)."""
        resources = dict(self.resources)
        cpus, gpus = resources.pop("CPU"), resources.pop("GPU", 0.0)
        options = {"num_cpus": cpus, "num_gpus": gpus, "resources": resources}
        if self.label_selector:
            options["label_selector"] = dict(self.label_selector)
        return options


# ------------------------------------------------------------------------------ probing and emulation


class ProbeConfig(HeteroModel):
    """How the first plan is measured (nothing is measured when ``train.fixed_shares`` is set).

    Attributes:
        mode: ``"passive"`` (default): no phase before step 0 but the memory probe of
            ``BatchConfig.max_memory_fraction``; training starts on a prior (cost models
            remembered for these worker types and this model, else equal slices), the first
            ``passive_steps`` training steps are timed as they run and the group switches to
            the measured plan at the next agreed step. ``"probe"``: probe every worker at
            several batch sizes and calibrate before step 0 (the fields below). The
            model-parallel modes always probe. ``group`` ``train`` / ``auto`` decide on what
            was measured: at the passive window's end (a worker left out makes the group
            restart on the kept slots, from the run's latest checkpoint), or after the probe.
        passive_steps: Training steps timed for the first measured plan (after the group's
            first step, which sets DDP up and is not timed).
        remember: Store measured cost models with the run's storage
            (``<storage_path>/.raytrain_hetero/cost_models``), keyed by the model (its
            architecture, parameter shapes and dtypes, the input's shape), the worker type and
            its hardware, and start later runs, Tune trials and new slots from them.
        batch_sizes: Batch sizes to time (>= 2 distinct, to fit t(b) = alpha + beta*b);
            ``None`` lets the prober choose from the global batch size.
        warmup: Untimed iterations before timing. repeats: Timed iterations per size.
        calibration_steps: Measured synchronous steps per calibration round (after one
            untimed step): the whole group runs real forward/backward passes at the probe's
            slices, gradients discarded, and each rank's wall-clock busy time refits its cost.
            This captures what an isolated probe cannot see: co-located workers contending for
            cores, and synchronisation inside the step. 0 disables calibration.
        calibration_rounds: Calibrate-and-replan rounds.
        reuse_on_restart: After a worker-group restart (a node joined or was lost, a worker
            died), slots the previous group measured keep their cost models and only new
            slots are probed; calibration still refits everyone. Shortens the time until a
            joining node is used.
        group: What each worker does, one decision per group
            (:func:`raytrain_hetero.core.group_decision.decide_group`; see
            docs/concepts/group-decision.md): ``"all"`` (default), every worker trains;
            ``"train"``, a worker whose predicted cost exceeds what it adds (beyond the
            prediction's measured noise) stands by and the group is re-sized without it (Ray
            Train elastic restart); ``"auto"``, as ``train``, and with a Ray Data source a CPU
            worker that adds more samples/s feeding the trainers' input pipeline than training
            feeds instead (measured before the run, one probe).
        admission: Old name (kept): ``all`` -> ``group: all``, ``auto`` -> ``group: train``.
        roles: Old name (kept): ``auto`` -> ``group: auto``; ``train`` leaves ``admission``
            to decide (alone: ``group: all``). Giving an old key and ``group`` that disagree,
            or ``admission: all`` with ``roles: auto``, is refused with the fix.
    """

    mode: Literal["passive", "probe"] = "passive"
    passive_steps: PositiveInt = 3
    remember: bool = True
    batch_sizes: list[PositiveInt] | None = None
    warmup: Int = Field(2, ge=0)
    repeats: PositiveInt = 3
    calibration_steps: Int = Field(3, ge=0)
    calibration_rounds: Int = Field(2, ge=0)
    reuse_on_restart: bool = True
    group: Literal["auto", "train", "all"] = "all"
    admission: Literal["all", "auto"] | None = None
    roles: Literal["train", "auto"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """``admission`` / ``roles`` (the old names) mapped onto ``group``."""
        if not isinstance(data, Mapping):
            return data
        admission, roles = data.get("admission"), data.get("roles")
        if admission not in ("all", "auto") and roles not in ("train", "auto"):
            return data  # neither given (or a bad value: its own field reports it)
        if admission == "all" and roles == "auto":
            raise invalid(
                "admission: all (every worker trains) contradicts roles: auto (a CPU worker "
                "may feed instead)",
                "give group: auto (train, feed or stand by) or group: all, not the old keys",
            )
        mapped = "auto" if roles == "auto" else "train" if admission == "auto" else "all"
        given = data.get("group")
        if given is not None and given != mapped:
            old = ", ".join(
                f"{k}: {v}" for k, v in (("admission", admission), ("roles", roles)) if v
            )
            raise invalid(
                f"group: {given} contradicts {old} (the old name of group: {mapped})",
                f"keep only group (e.g. group: {given}) and remove the old key",
            )
        return {**data, "group": mapped}

    @field_validator("batch_sizes")
    @classmethod
    def _two_distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) < 2:
            raise invalid(
                f"needs at least 2 distinct batch sizes to fit a cost model, got {value}",
                "list two or more sizes, e.g. [8, 32], or remove the key for automatic sizes",
            )
        return value


class SlowdownInjection(HeteroModel):
    """EMULATION: make one worker (by name) or rank ``factor`` times slower from a step on.

    Attributes:
        factor: Slowdown factor (>= 1) multiplied onto the worker's ``emulated_slowdown``.
        worker: WorkerSpec name (counts expanded: ``name-i``), or
        rank: a world rank (exactly one of the two).
        from_step: First global step it applies to.
    """

    factor: Float = Field(ge=1.0, allow_inf_nan=False, description="slowdown factor >= 1")
    worker: str | None = None
    rank: Int | None = Field(None, ge=0)
    from_step: Int = Field(0, ge=0)

    @model_validator(mode="after")
    def _one_target(self) -> SlowdownInjection:
        if (self.worker is None) == (self.rank is None):
            raise invalid(
                "names neither or both of worker and rank",
                "give exactly one, e.g. {factor: 3, worker: medium, from_step: 50}",
            )
        return self

    def applies_to(self, worker: str, rank: int, step: int) -> bool:
        """True if this injection slows ``worker`` (slot name) / ``rank`` at global ``step``."""
        targets = self.worker == worker if self.worker is not None else self.rank == rank
        return targets and step >= self.from_step


def worker_groups(workers: Sequence[WorkerSpec | Mapping[str, Any]]) -> tuple[WorkerSpec, ...]:
    """The worker groups as WorkerSpecs (mappings validated), counts not expanded.

    Raises:
        ConfigError: ``workers`` is empty, or a mapping is not a valid WorkerSpec (the message
            names ``workers[i].<field>`` and the fix).
    """
    if not workers:
        raise ConfigError(
            "workers: the list is empty. Fix: give at least one WorkerSpec, e.g. "
            "[WorkerSpec(name='fast')]."
        )
    return tuple(
        item if isinstance(item, WorkerSpec) else _worker_spec(position, item)
        for position, item in enumerate(workers)
    )


def expand_worker_specs(workers: Sequence[WorkerSpec | Mapping[str, Any]]) -> list[WorkerSpec]:
    """One spec per worker slot, in rank order: the one place worker counts are expanded.

    Groups with ``count > 1`` expand to ``<name>-0``, ``<name>-1``, ...; groups with
    ``count == 1`` keep their name. Mappings are validated into WorkerSpecs first.

    Raises:
        ConfigError: As :func:`worker_groups`.
    """
    specs: list[WorkerSpec] = []
    for spec in worker_groups(workers):
        if spec.count == 1:
            specs.append(spec)
            continue
        specs.extend(
            spec.model_copy(update={"name": f"{spec.name}-{i}", "count": 1})
            for i in range(spec.count)
        )
    return specs


def _worker_spec(position: int, item: Mapping[str, Any]) -> WorkerSpec:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"workers[{position}]: expected a WorkerSpec or a mapping of its fields, got "
            f"{type(item).__name__}. Fix: pass WorkerSpec(name=...)."
        )
    try:
        return WorkerSpec.model_validate(dict(item))
    except ValidationError as exc:
        raise_validation_error(
            exc, WorkerSpec, source="HeteroTrainer", prefix=("workers", position)
        )
