"""The next epoch's first slices read before the current epoch ends (DataLoader processes).

A torch ``DataLoader`` with worker processes prefetches ``prefetch_factor * num_workers``
batches, but only within the iterator it was made for: every epoch's first step used to wait
while the processes started on its order. The carving is seeded, so the next epoch's order is
known in advance; :class:`EpochStream` hands out one epoch's batches after another with the
next epoch's first ones already in flight:

* **persistent workers** (``persistent_workers=True``): one iterator for the whole run over a
  sampler that runs on from epoch to epoch (``set_position(..., onward=True)``), so the
  processes' prefetch crosses each epoch's end; the workers are seeded once, as torch seeds
  persistent workers.
* **workers per epoch**: the next epoch's iterator is made (its generator seeded for that
  epoch, as before) once the current epoch's last batches are all in flight, so its processes
  start and read while the current epoch's last steps run.

The batches are the carving's, in the carving's order, whatever the timing: each step's
indices are drawn (and the step marked carved, under the plan governing it) when the
DataLoader asks the sampler, as within an epoch before. A position that does not continue the
stream (a resume, a loop that left an epoch early) starts a new stream there. Nothing here
imports the sampler: it is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from torch.utils.data import DataLoader

from raytrain_hetero.errors import DataError

__all__ = ["EpochStream"]


class PositionedSampler(Protocol):
    """A batch sampler told where its next iteration starts (the carving sampler)."""

    def set_position(self, epoch: int, start_step: int, *, onward: bool = False) -> None: ...


class EpochStream:
    """One epoch's batches after another, the next epoch's first ones read ahead.

    Args:
        loader: A ``DataLoader`` with worker processes over ``sampler``.
        sampler: Its batch sampler.
        seed_epoch: Seeds the loader's generator for an epoch, before its iterator is made.
        steps_per_epoch: Steps (batches) in a whole epoch.
    """

    def __init__(
        self,
        loader: DataLoader,
        sampler: PositionedSampler,
        seed_epoch: Callable[[int], None],
        steps_per_epoch: int,
    ) -> None:
        self._loader = loader
        self._sampler = sampler
        self._seed_epoch = seed_epoch
        self._steps = steps_per_epoch
        self._persistent = bool(loader.persistent_workers)
        # Batches in flight once the sampler is ahead: what the processes prefetch.
        self._depth = max(1, int(loader.prefetch_factor or 2) * loader.num_workers)
        self._running: Iterator[Any] | None = None  # persistent: the run's one iterator
        self._position: tuple[int, int] | None = None  # (epoch, step) of its next batch
        self._ahead: tuple[int, Iterator[Any]] | None = None  # per-epoch: the next one

    def epoch(self, epoch: int, start: int) -> Iterator[Any]:
        """The batches of ``epoch`` from step ``start`` to its end."""
        return self._hand_out(self._take(epoch, start), epoch, start)

    def _take(self, epoch: int, start: int) -> Iterator[Any]:
        if self._persistent:
            if self._running is None or self._position != (epoch, start):
                self._sampler.set_position(epoch, start, onward=True)
                self._seed_epoch(epoch)
                self._running = iter(self._loader)  # the one iterator, reset to the position
                self._position = (epoch, start)
            return self._running
        ahead, self._ahead = self._ahead, None
        if ahead is not None and start == 0 and ahead[0] == epoch:
            return ahead[1]
        del ahead  # an iterator opened for another position: its processes shut down
        return self._open(epoch, start)

    def _open(self, epoch: int, start: int) -> Iterator[Any]:
        self._sampler.set_position(epoch, start)
        self._seed_epoch(epoch)
        return iter(self._loader)

    def _hand_out(self, batches: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        for step in range(start, self._steps):
            try:
                batch = next(batches)
            except StopIteration:
                raise DataError(
                    f"the DataLoader ended epoch {epoch} at step {step} of {self._steps}: its "
                    "batch sampler was replaced or iterated elsewhere. Fix: iterate only the "
                    "loader prepare_data_loader returned."
                ) from None
            last = step + 1 == self._steps
            self._position = (epoch + 1, 0) if last else (epoch, step + 1)
            if (
                not self._persistent
                and self._ahead is None
                and self._steps - 1 - step <= self._depth
            ):
                # This epoch's remaining batches are all in flight: start the next one's.
                self._ahead = (epoch + 1, self._open(epoch + 1, 0))
            yield batch
