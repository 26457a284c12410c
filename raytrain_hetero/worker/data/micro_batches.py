"""A slice above the worker's per-pass memory cap, run as count-weighted micro-batches.

Each part's mean loss is scaled by n_m/n, so the accumulated gradient is the slice's mean;
DDP's ``no_sync`` holds back every part but the last, whose backward runs the count-weighted
hook once: the update equals the single-device one. Exact global-batch BatchNorm cannot be
split this way (each part would exchange its own statistics): :func:`check_micro_batching`
refuses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from raytrain_hetero.core.memory import micro_batch_sizes
from raytrain_hetero.errors import ConfigError, HeteroError

__all__ = [
    "MicroBatch",
    "check_micro_batching",
    "iterate_micro_batches",
    "pass_caps_note",
    "split_batch",
]


@dataclass(frozen=True)
class MicroBatch:
    """One part of this rank's slice.

    Attributes:
        data: The part, in the batch's own structure (tensors cut along dim 0).
        weight: n_m / n: multiply the part's mean loss by it before ``backward()``.
        size: Samples in the part (n_m).
    """

    data: Any
    weight: float
    size: int


def split_batch(batch: Any, sizes: Sequence[int]) -> list[Any]:
    """Cut ``batch`` into consecutive parts of ``sizes`` along dim 0 of every tensor.

    Tensors are cut; tuples, lists and mappings are walked; other values are repeated in
    every part.

    Raises:
        HeteroError: A tensor's first dimension is not ``sum(sizes)``.
    """
    total = sum(sizes)
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0 or batch.shape[0] != total:
            raise HeteroError(
                f"Cannot split a batch tensor of shape {tuple(batch.shape)} into micro-batches "
                f"of {list(sizes)}: its first dimension must be the slice's {total} samples."
            )
        return list(torch.split(batch, list(sizes)))
    if isinstance(batch, Mapping):
        split = {k: split_batch(v, sizes) for k, v in batch.items()}
        return [type(batch)({k: v[i] for k, v in split.items()}) for i in range(len(sizes))]
    if isinstance(batch, (tuple, list)):
        columns = [split_batch(v, sizes) for v in batch]
        return [type(batch)(c[i] for c in columns) for i in range(len(sizes))]
    return [batch] * len(sizes)


def check_micro_batching(model: torch.nn.Module, *, exact_batchnorm: bool) -> None:
    """Refuse a model whose exact BatchNorm statistics micro-batching would change.

    Raises:
        ConfigError: ``exact_batchnorm`` and the model has BatchNorm layers.
    """
    if exact_batchnorm and any(isinstance(m, _BatchNorm) for m in model.modules()):
        raise ConfigError(
            "Memory caps with memory_cap_mode 'accumulate' split a slice into micro-batches, "
            "but exact BatchNorm needs the whole slice's statistics in one pass. Fix: set "
            "batchnorm: ghost (groups of ghost_size samples, micro-batches in whole groups: "
            "exact against one device running ghost BatchNorm), batchnorm: local "
            "(per-micro-batch statistics, not the one-device computation), use "
            "memory_cap_mode: slice (capped slices, exact), or a model without BatchNorm."
        )


def iterate_micro_batches(
    batch: Any, slice_size: int, cap: int | None, ddp_model: Any, quantum: int = 1
) -> Iterator[MicroBatch]:
    """The parts of ``batch`` (a slice of ``slice_size``) within ``cap``, DDP sync on the last.

    A slice within the cap is yielded whole with weight 1 and nothing else changes. Each
    part's forward and backward must run before the next part is requested (they run inside
    ``ddp_model.no_sync()`` for every part but the last). ``quantum``: parts in whole ghost
    groups (:func:`~raytrain_hetero.core.memory.micro_batch_sizes`); each part's running
    statistics join the step's, updated once after the last part.
    """
    sizes = micro_batch_sizes(slice_size, cap, quantum)
    if len(sizes) == 1:
        yield MicroBatch(batch, 1.0, slice_size)
        return
    no_sync = getattr(ddp_model, "no_sync", None)
    if no_sync is None:
        raise HeteroError(
            "micro_batches needs the model from prepare_model (DDP) to defer the gradient "
            "exchange to the last micro-batch."
        )
    parts = split_batch(batch, sizes)
    for index, (part, size) in enumerate(zip(parts, sizes)):
        last = index == len(sizes) - 1
        with contextlib.nullcontext() if last else no_sync():
            yield MicroBatch(part, size / slice_size, size)


def pass_caps_note(pass_caps: Sequence[int | None] | None) -> str:
    """The ranks' caps in samples per pass, for a plan's reason (empty when none has one)."""
    if pass_caps is None or all(c is None for c in pass_caps):
        return ""
    caps = ", ".join(f"r{r}:{c}" for r, c in enumerate(pass_caps) if c is not None)
    return f"; samples/pass caps {caps}"
