"""Peak memory per sample of one worker, and the cap in samples per pass it implies.

Measured alone on the bare model, one forward+backward per batch size: on CUDA the allocator's
peak; on CPU the process's resident-set peak (``VmHWM``, reset through ``clear_refs``) after
``malloc_trim`` (else a pass reuses heap an earlier, larger pass left and reads low). The CPU
figure is noisy, so the largest of a few repeats is kept and a fraction below 1 leaves the
margin; without ``/proc`` or glibc CPU workers get no probed cap (logged).
:func:`fit_memory_model` and :func:`~raytrain_hetero.core.memory.memory_cap` turn the peaks
into samples per pass.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raytrain_hetero.core.memory import MemoryModel, fit_memory_model, memory_cap
from raytrain_hetero.errors import ProbeError

logger = logging.getLogger(__name__)

__all__ = [
    "MemoryProbe",
    "memory_probe_batch_sizes",
    "probe_memory",
    "worker_memory_bytes",
]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class MemoryProbe:
    """What the memory probe found on one worker.

    Attributes:
        model: Peak bytes of one forward+backward pass as ``fixed + per_sample * b``.
        budget_bytes: Bytes a pass may use (the fraction of the worker's memory, less what
            the process held before the pass unless that memory is the node's available RAM,
            which already excludes it).
        cap: Samples per pass that fit the budget (``None``: no cap binds).
    """

    model: MemoryModel
    budget_bytes: float
    cap: int | None


def memory_probe_batch_sizes(even_slice: int, cap: int | None) -> tuple[int, ...]:
    """Two sizes to fit the peak with: a quarter and a half of the even slice (>= 1, 2).

    Small on purpose: the probe must not itself run out of the memory it is measuring.
    """
    low = max(1, even_slice // 4)
    high = max(low + 1, even_slice // 2)
    if cap is not None:
        high = min(high, max(2, cap))
        low = min(low, high - 1)
    return (low, high)


def _rss_bytes() -> tuple[int, int]:
    """(current resident set, its peak since the last reset) of this process, in bytes."""
    values = {}
    for line in _STATUS.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024  # reported in kB
    return values["VmRSS"], values["VmHWM"]


def _cpu_peak_tracking() -> Callable[[], None] | None:
    """A function that trims the heap and resets the RSS peak; None where that is impossible."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = libc.malloc_trim if libc is not None else None
        _rss_bytes()
        with _CLEAR_REFS.open("w") as f:
            f.write("5")
    except (OSError, AttributeError, KeyError):
        return None

    def reset() -> None:
        if trim is not None:
            trim(0)
        with _CLEAR_REFS.open("w") as f:
            f.write("5")

    return reset


def _pass_peak(device: torch.device, run_pass: Callable[[], None]) -> tuple[int, int] | None:
    """(bytes held before the pass, peak growth during it), or None if not measurable."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run_pass()
        torch.cuda.synchronize(device)
        return before, torch.cuda.max_memory_allocated(device) - before
    reset = _cpu_peak_tracking()
    if reset is None:
        return None
    reset()
    before, _ = _rss_bytes()
    run_pass()
    _, peak = _rss_bytes()
    return before, max(0, peak - before)


def worker_memory_bytes(device: torch.device, ray_memory_bytes: float | None) -> float | None:
    """Memory a worker may fill: the CUDA device's total; on CPU the worker's Ray ``memory``
    resource if it requested one, else the node's available RAM (None if unknown)."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    if ray_memory_bytes:
        return float(ray_memory_bytes)
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return None


def probe_memory(
    model: torch.nn.Module,
    make_batch: Callable[[int], Any],
    batch_sizes: Sequence[int],
    *,
    device: torch.device | str,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    fraction: float,
    ray_memory_bytes: float | None = None,
    ranks_on_node: int = 1,
    repeats: int = 2,
) -> MemoryProbe | None:
    """Measure one worker's peak memory per pass and derive its cap in samples per pass.

    ``model`` is the bare module (probing must not communicate); its parameters, gradients,
    buffers and mode are restored afterwards. ``batch_sizes``: >= 2 distinct sizes that fit;
    ``fraction``: share of the worker's memory a pass may use; without a Ray ``memory``
    resource (``ray_memory_bytes``) a CPU worker's budget is its share of the node's available
    RAM among ``ranks_on_node`` workers; the largest peak of ``repeats`` passes is kept.

    Returns:
        The probe, or None where peaks cannot be measured (CPU without /proc or glibc).

    Raises:
        ProbeError: Not even one sample fits the budget, or a probe pass ran out of memory.
    """
    device = torch.device(device)
    if len(set(batch_sizes)) < 2:
        raise ProbeError(f"The memory probe needs >= 2 distinct sizes, got {list(batch_sizes)}.")
    total = worker_memory_bytes(device, ray_memory_bytes)
    if total is None:
        logger.warning("memory probe: this worker's memory size is unknown; no memory cap")
        return None
    saved_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    was_training = model.training
    model.train()
    sizes = sorted(set(batch_sizes))
    peaks: list[float] = []
    held = 0
    try:
        for b in sizes:
            worst = 0
            for _ in range(max(1, repeats)):
                batch = make_batch(b)
                model.zero_grad(set_to_none=True)

                def run_pass(batch: Any = batch) -> None:
                    loss_fn(model, batch).backward()

                measured = _pass_peak(device, run_pass)
                del batch
                if measured is None:
                    logger.warning(
                        "memory probe: cannot read this process's peak memory on %s (needs "
                        "/proc/self/clear_refs and glibc); no memory cap",
                        device,
                    )
                    return None
                held, growth = measured
                worst = max(worst, growth)
            peaks.append(float(worst))
    except torch.cuda.OutOfMemoryError as exc:
        raise ProbeError(
            f"The memory probe ran out of memory on {device} at batch sizes {sizes}. Fix: set "
            "WorkerSpec.max_micro_batch for this worker below the smallest size, or use a "
            "smaller model."
        ) from exc
    finally:
        model.load_state_dict(saved_state)
        for p, g in zip(model.parameters(), saved_grads):
            p.grad = g
        model.train(was_training)
    fitted = fit_memory_model(sizes, peaks)
    # The node's available RAM already excludes what this process holds; a device's total
    # or a Ray memory resource does not.
    available_ram = device.type == "cpu" and not ray_memory_bytes
    if available_ram:
        budget = fraction * total / max(1, ranks_on_node)
    else:
        budget = fraction * total - held
    cap = memory_cap(fitted.fixed_bytes, fitted.per_sample_bytes, budget)
    if cap == 0:
        raise ProbeError(
            f"Not even one sample fits the memory budget on {device}: a pass needs "
            f"{fitted.peak(1) / 2**20:.1f} MiB, the budget is {budget / 2**20:.1f} MiB "
            f"({fraction:g} of {total / 2**20:.0f} MiB, less {held / 2**20:.0f} MiB held). Fix: "
            "raise max_memory_fraction, give the worker more memory, or use a smaller model."
        )
    logger.info(
        "memory probe on %s: %.0f KiB fixed + %.1f KiB/sample, budget %.0f MiB -> cap %s",
        device,
        fitted.fixed_bytes / 1024,
        fitted.per_sample_bytes / 1024,
        budget / 2**20,
        cap,
    )
    return MemoryProbe(model=fitted, budget_bytes=budget, cap=cap)
