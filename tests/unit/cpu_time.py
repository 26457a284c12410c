"""Work that burns a known amount of this thread's CPU time, for the timing tests (with the
``one_thread`` fixture the compute clock reads thread CPU time)."""

from __future__ import annotations

import time

import torch


def burn(seconds: float, size: int = 200) -> None:
    """Spend about ``seconds`` of this thread's CPU time."""
    start = time.thread_time()
    a = torch.randn(size, size)
    while time.thread_time() - start < seconds:
        a = torch.tanh(a @ a.T / size)
