"""Point-to-point tensor transfer with byte counting (torch.distributed send/recv, gloo or NCCL).

A receiver cannot know an activation's shape in advance (short last batch, uneven
micro-batches), so such a tensor travels behind a fixed header of 8 int64 values (dtype code,
dimensions, up to six sizes); gradients come back headerless in their activation's shape.
Every byte, headers included, is counted in a :class:`Traffic` record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from raytrain_hetero.errors import ModelParallelError

__all__ = ["HEADER_BYTES", "Traffic", "recv_tensor", "send_tensor"]

_HEADER_LEN = 8
_MAX_DIMS = _HEADER_LEN - 2
#: Bytes of the shape header that precedes each activation.
HEADER_BYTES = _HEADER_LEN * 8
_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclass
class Traffic:
    """Payload bytes one rank sent and received, headers included (mutable counter)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    _pending: list[dist.Work] = field(default_factory=list, repr=False)
    _keep_alive: list[torch.Tensor] = field(default_factory=list, repr=False)

    def add_sent(self, nbytes: int) -> None:
        """Count one send of ``nbytes``."""
        self.bytes_sent += nbytes

    def wait_all(self) -> None:
        """Wait until every asynchronous send started through this counter has completed."""
        for work in self._pending:
            work.wait()
        self._pending.clear()
        self._keep_alive.clear()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _isend(tensor: torch.Tensor, dst: int, tag: int, traffic: Traffic, group: object) -> None:
    work = dist.isend(tensor, dst=dst, group=group, tag=tag)  # type: ignore[arg-type]
    traffic.add_sent(_nbytes(tensor))
    if work is not None:
        traffic._pending.append(work)
    traffic._keep_alive.append(tensor)  # the buffer must outlive the send


def send_tensor(
    tensor: torch.Tensor,
    dst: int,
    tag: int,
    traffic: Traffic,
    *,
    group: object = None,
    with_header: bool = True,
) -> None:
    """Start sending ``tensor`` to global rank ``dst`` (asynchronous; see Traffic.wait_all).

    Messages with one (src, ``tag``) pair arrive in order; ``traffic`` counts the bytes and
    keeps the send alive until waited for; ``with_header`` sends the shape header first.

    Raises:
        ModelParallelError: A dtype or rank the header cannot describe.
    """
    payload = tensor.detach().contiguous()
    if with_header:
        if payload.dtype not in _DTYPES or payload.dim() > _MAX_DIMS:
            raise ModelParallelError(
                f"cannot send a {payload.dtype} tensor of {payload.dim()} dimension(s) between "
                f"branch ranks: supported dtypes {[str(d) for d in _DTYPES]}, at most "
                f"{_MAX_DIMS} dimensions"
            )
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64, device=payload.device)
        header[0] = _DTYPES.index(payload.dtype)
        header[1] = payload.dim()
        header[2 : 2 + payload.dim()] = torch.tensor(payload.shape, dtype=torch.int64)
        _isend(header, dst, tag, traffic, group)
    _isend(payload, dst, tag, traffic, group)


def recv_tensor(
    src: int,
    tag: int,
    traffic: Traffic,
    *,
    group: object = None,
    like: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Receive one tensor from global rank ``src`` (blocking); with ``like``, the message has
    no header and that tensor's shape and dtype."""
    if like is None:
        header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=device)
        dist.recv(header, src=src, group=group, tag=tag)  # type: ignore[arg-type]
        traffic.bytes_received += HEADER_BYTES
        values = header.tolist()
        shape = values[2 : 2 + values[1]]
        out = torch.empty(shape, dtype=_DTYPES[values[0]], device=device)
    else:
        out = torch.empty_like(like, device=device)
    dist.recv(out, src=src, group=group, tag=tag)  # type: ignore[arg-type]
    traffic.bytes_received += _nbytes(out)
    return out
