"""Timed forward/backward probes of one worker, alone (no communication).

Every timing goes through the one :class:`~raytrain_hetero.worker.measure.timing.ProbeTimer`, under
EMULATION accounted, not slept. The one collective here, :func:`time_gradient_allreduce`,
times the gradient all-reduce for admission; node rounds and calibration live in
:mod:`raytrain_hetero.worker.plan.calibration`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.core.allocation import CostModel, fit_cost_model
from raytrain_hetero.errors import ProbeError
from raytrain_hetero.worker.measure.clock import ComputeClock, WallClock
from raytrain_hetero.worker.measure.emulation import emulate_collective_delay
from raytrain_hetero.worker.measure.timing import ProbeTimer, loader_bound_s

logger = logging.getLogger(__name__)


def default_probe_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Scalar to back-propagate in a probe: the mean of the model output on the batch input.

    The input is the batch itself if it is a tensor, its first element if a sequence, or its
    ``"image"`` entry (else first tensor value) if a mapping, which covers torchgeo's dicts.
    """
    if isinstance(batch, torch.Tensor):
        inputs = batch
    elif isinstance(batch, (list, tuple)):
        inputs = batch[0]
    elif isinstance(batch, dict):
        inputs = batch.get("image")
        if inputs is None:
            inputs = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    else:
        raise ProbeError(
            f"Cannot find the model input in a batch of type {type(batch).__name__}; pass "
            "probe_loss=fn(model, batch) -> scalar tensor to prepare_data_loader."
        )
    output = model(inputs)
    if isinstance(output, (list, tuple)):
        output = output[0]
    return output.float().mean()


@dataclass(frozen=True)
class ProbeResult:
    """Median seconds of one training step at each probed batch size.

    Attributes:
        batch_sizes: Probed batch sizes.
        seconds: Median loader-bound seconds per size: forward+backward (emulated slowdown
            applied) and, where the probe timed loading, the wait for the batch
            (:func:`~raytrain_hetero.worker.measure.timing.loader_bound_s`).
        compute_seconds: Median seconds of forward+backward alone per size (the step with
            its data already loaded); empty when not timed apart.
    """

    batch_sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    compute_seconds: tuple[float, ...] = ()

    def cost_model(self) -> CostModel:
        """Affine cost model fitted to the (loader-bound) timings."""
        return _fit(self.batch_sizes, self.seconds)

    def compute_model(self) -> CostModel | None:
        """Affine cost model of the compute alone (None when not timed apart)."""
        return _fit(self.batch_sizes, self.compute_seconds) if self.compute_seconds else None


def _fit(batch_sizes: Sequence[int], seconds: Sequence[float]) -> CostModel:
    if len(set(batch_sizes)) >= 2:
        return fit_cost_model(batch_sizes, seconds)
    # A cap of one sample leaves a single size: a pure per-sample model.
    return CostModel(alpha=0.0, beta=seconds[0] / batch_sizes[0])


def default_probe_batch_sizes(
    global_batch_size: int, world_size: int, cap: int | None
) -> tuple[int, ...]:
    """Half, one and two times the even slice, within the cap (>= 2 sizes when possible)."""
    even = max(1, math.ceil(global_batch_size / world_size))
    sizes = {max(1, even // 2), even, 2 * even}
    if cap is not None:
        sizes = {min(s, cap) for s in sizes}
    if len(sizes) < 2 and (cap is None or cap >= 2):
        sizes.add(2 if min(sizes) == 1 else 1)
    return tuple(sorted(sizes))


def probe_step_costs(
    model: torch.nn.Module,
    make_batch: Callable[[int], Any],
    batch_sizes: Sequence[int],
    *,
    device: torch.device | str,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] = default_probe_loss,
    warmup: int = 2,
    repeats: int = 3,
    slowdown: float = 1.0,
    time_loading: bool = False,
    loader_processes: int = 0,
) -> ProbeResult:
    """Time a training step's cost of ``model`` at each batch size, warm-up excluded.

    A step's cost is forward+backward (stretched by ``slowdown``) and, with ``time_loading``,
    the wait for its batch: building it (reading, collating, the copy to the device) is timed
    in this process, unstretched (a slower accelerator does not read data more slowly), and
    priced as the training loader reads (:func:`~raytrain_hetero.worker.measure.timing.loader_bound_s`:
    in full without DataLoader processes, the part ``loader_processes`` reading in parallel
    cannot hide otherwise). ``model`` is the bare module (probing must not communicate); its
    parameters, gradients and buffers are restored afterwards. ``repeats`` timed calls per
    size, median kept, after ``warmup``.

    Raises:
        ProbeError: If a size is invalid or a timing is not a positive finite number.
    """
    if not batch_sizes or min(batch_sizes) < 1:
        raise ProbeError(f"Probe batch sizes must be >= 1, got {list(batch_sizes)}.")
    timer = ProbeTimer(ComputeClock(device), slowdown=slowdown)
    saved_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    was_training = model.training
    model.train()

    def step(batch_size: int) -> None:
        batch = make_batch(batch_size)
        timer.setup_done()  # loading ends, compute starts
        loss_fn(model, batch).backward()

    sizes = sorted(set(batch_sizes))
    steps = [lambda b=b: step(b) for b in sizes]
    try:
        # Warm-up at the largest size only: it grows the allocator for the smaller ones.
        timings = timer.run(
            steps,
            repeats=repeats,
            warmup=warmup,
            warm=steps[-1:],
            cleanup=lambda: model.zero_grad(set_to_none=True),
        )
    finally:
        model.load_state_dict(saved_state)
        for p, g in zip(model.parameters(), saved_grads):
            p.grad = g
        model.train(was_training)
    compute = [t.median for t in timings]
    seconds = compute
    if time_loading:  # each call's own compute and loading, priced together, then the median
        seconds = [
            statistics.median(
                loader_bound_s(c, u, loader_processes) for c, u in zip(t.seconds, t.setup)
            )
            for t in timings
        ]
    for b, median in zip(sizes, seconds):
        if not math.isfinite(median) or median <= 0:
            raise ProbeError(
                f"Probe at batch {b} measured {median!r} s; timings must be positive. "
                "Increase the probe batch sizes."
            )
    result = ProbeResult(tuple(sizes), tuple(seconds), tuple(compute) if time_loading else ())
    logger.info(
        "probe on %s (loader-bound, compute): %s",
        device,
        {b: (round(s, 5), round(c, 5)) for b, s, c in zip(sizes, seconds, compute)},
    )
    return result


def time_gradient_allreduce(
    model: torch.nn.Module,
    *,
    group: Any = None,
    repeats: int = 3,
    collective_delay_s: float = 0.0,
) -> float:
    """Seconds of one SUM all-reduce as large as ``model``'s gradients on ``group``.

    A collective of ``group`` (default: the world); call it on its members only. One untimed
    all-reduce, then ``repeats`` timed ones, each after a barrier (a wait for late peers is
    not counted); the members agree on the largest median (the step waits for it).
    ``collective_delay_s`` (EMULATION of a slow link) is slept before each, as in the hook.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    if device.type == "cuda" and dist.get_backend(group) == dist.Backend.GLOO:
        device = torch.device("cpu")
    payload = torch.zeros(max(1, numel), dtype=torch.float32, device=device)
    timer = ProbeTimer(WallClock(device))

    def exchange() -> None:
        dist.barrier(group=group)
        timer.setup_done()  # a rank's wait for late peers is not the all-reduce's cost
        emulate_collective_delay(collective_delay_s)
        dist.all_reduce(payload, group=group)

    # The warm-up is one plain all-reduce: it opens the connections, without the delay.
    warm = [lambda: dist.all_reduce(payload, group=group)]
    (timings,) = timer.run([exchange], repeats=max(1, repeats), warm=warm)
    agreed = torch.tensor([timings.median], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    return float(agreed.item())


@dataclass(frozen=True)
class CostKey:
    """Where this worker's cost model is remembered: a digest and what it stands for.

    Attributes:
        digest: Hex SHA-256 of ``about`` (the file name in the store).
        about: The model, input, worker type and hardware the cost model is valid for.
    """

    digest: str
    about: dict[str, Any]


def cost_key(
    model: torch.nn.Module, sample_batch: Any, spec: Any, device: str, *, setup: dict[str, Any]
) -> CostKey:
    """The key of a cost model: it changes whenever what a step costs may change.

    Covers the model (every module's class, every parameter's and buffer's name, shape and
    dtype), the input (shape and dtype of each tensor of a one-sample batch), the worker type
    (:meth:`WorkerSpec.worker_type`: the spec but its name, count, caps and node pin, so the
    same type under another slot name or on another node of the type is the same), the hardware (GPU name, or CPU model and torch threads) and ``setup`` (step settings
    that change the cost, e.g. exact BatchNorm, loading in the step).
    """
    module = getattr(model, "module", model)
    tensors = [
        (name, list(t.shape), str(t.dtype))
        for name, t in [*module.named_parameters(), *module.named_buffers()]
    ]

    def shapes(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return [list(value.shape[1:]), str(value.dtype)]
        if isinstance(value, dict):
            return {str(k): shapes(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
        if isinstance(value, (list, tuple)):
            return [shapes(v) for v in value]
        return type(value).__name__

    hardware = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    if torch.device(device).type == "cuda":
        hardware["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        hardware["cpu"] = _cpu_model()
    about = {
        "modules": [type(m).__name__ for m in module.modules()],
        "tensors": tensors,
        "input": shapes(sample_batch),
        "worker": spec.worker_type(),
        "hardware": hardware,
        "setup": setup,
    }
    digest = hashlib.sha256(json.dumps(about, sort_keys=True).encode()).hexdigest()
    return CostKey(digest, about)


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
