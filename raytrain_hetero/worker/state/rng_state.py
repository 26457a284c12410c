"""Per-rank random-number-generator state, saved in the checkpoint state for a bit-exact resume.

Dropout and any other randomness in the loop draw from torch's CPU generator (and the
device's CUDA generator), numpy's and Python's global generators. :func:`capture_rng` reads all
of them into a JSON-ready :class:`RngState`; :func:`restore_rng` puts them back, so a group
restarted from a checkpoint draws exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["RngState", "capture_rng", "restore_rng"]


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


@dataclass(frozen=True)
class RngState:
    """The generator states of one rank.

    Attributes:
        torch_cpu: torch's CPU generator state (base64).
        torch_cuda: The CUDA generator state of the rank's device (base64), or None on CPU.
        numpy: numpy's legacy global ``RandomState`` (``np.random.get_state()`` as lists).
        python: Python's ``random`` state (``random.getstate()`` as lists).
    """

    torch_cpu: str
    torch_cuda: str | None
    numpy: tuple[Any, ...]
    python: tuple[Any, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "torch_cpu": self.torch_cpu,
            "torch_cuda": self.torch_cuda,
            "numpy": list(self.numpy),
            "python": list(self.python),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RngState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            torch_cpu=str(data["torch_cpu"]),
            torch_cuda=data.get("torch_cuda"),
            numpy=tuple(data["numpy"]),
            python=tuple(data["python"]),
        )


def capture_rng(device: torch.device | str = "cpu") -> RngState:
    """The generator states of this process now (CUDA: the generator of ``device``)."""
    device = torch.device(device)
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    cuda = None
    if device.type == "cuda":
        cuda = _encode(torch.cuda.get_rng_state(device))
    return RngState(
        torch_cpu=_encode(torch.get_rng_state()),
        torch_cuda=cuda,
        numpy=(str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        python=(int(version), [int(v) for v in internal], gauss_next),
    )


def restore_rng(state: RngState, device: torch.device | str = "cpu") -> None:
    """Put the generator states of ``state`` back (CUDA: into the generator of ``device``)."""
    device = torch.device(device)
    torch.set_rng_state(_decode(state.torch_cpu))
    if state.torch_cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(_decode(state.torch_cuda), device)
    name, keys, pos, has_gauss, cached = state.numpy
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state.python
    random.setstate((version, tuple(internal), gauss_next))
