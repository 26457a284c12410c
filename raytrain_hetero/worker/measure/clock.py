"""The compute clock: seconds of this worker's own compute, and the wall clock for waits.

Compute is this worker's *own* work, not wall time, so workers sharing cores do not distort
each other's figures: on CPU with one intra-op thread the calling thread's CPU time (forward
and backward run on the caller's thread); with several threads wall time, since their summed
CPU time would count each second of a 4-thread worker four times; on CUDA wall time after
``torch.cuda.synchronize``. The step accounting (:mod:`.timing`) and the slowdown emulator
(:mod:`.emulation`) both read it.
"""

from __future__ import annotations

import time

import torch

__all__ = ["ComputeClock", "WallClock"]


class ComputeClock:
    """Reads seconds of this worker's own compute on ``device``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def now(self) -> float:
        """Current reading; differences are compute seconds."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        if torch.get_num_threads() == 1:
            return time.thread_time()
        return time.perf_counter()


class WallClock(ComputeClock):
    """Reads wall seconds (after ``torch.cuda.synchronize`` on CUDA): for probes whose cost is
    waiting on others (a collective), not this worker's own compute."""

    def now(self) -> float:
        """Current wall-clock reading."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
