"""Row ranges of a streamed epoch, served to the ranks that carve it (the Ray Data path).

A streamed dataset has no random access: each epoch is one pass over a stream of column
chunks (Ray Data's blocks, as ``{column: array}``). The carving is the map-style one with the
identity permutation (:class:`~raytrain_hetero.core.carving.EpochCarver` with
``shuffle=False``): a rank asks for the stream positions ``[lo, hi)`` of its slice of a step,
and :class:`EpochStreams` reads the stream just far enough to cut them. Rows no rank can still
ask for are dropped: every rank's next step starts at or after its latest one, so everything
before the smallest "latest step start" over the ranks is done with. The window therefore
holds about the global batches the ranks are apart (they are in lockstep through the gradient
all-reduce) plus one chunk, never the epoch.

Every epoch must yield exactly the rows counted when the run started; a stream that ends early
or runs long is an error, never a silent drop or repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from raytrain_hetero.errors import DataError, HeteroError

Chunk = dict[str, np.ndarray]


def chunk_rows(chunk: Chunk) -> int:
    """Rows of a column chunk (all columns have the same length)."""
    lengths = {len(column) for column in chunk.values()}
    if len(lengths) > 1:
        raise DataError(f"a batch's columns have different lengths {sorted(lengths)}")
    return lengths.pop() if lengths else 0


@dataclass
class RowWindow:
    """The rows ``[start, read)`` of one epoch's stream still held, in order.

    Attributes:
        start: Position of the first row held (rows before it were dropped or skipped).
        read: Rows read from the stream so far (including skipped ones).
        chunks: Held chunks with the position of their first row.
    """

    start: int = 0
    read: int = 0
    chunks: list[tuple[int, Chunk]] = field(default_factory=list)

    @property
    def held(self) -> int:
        """Rows held (the memory the window costs, in rows)."""
        return sum(chunk_rows(c) for _, c in self.chunks)

    def append(self, chunk: Chunk) -> None:
        """Add the stream's next chunk; its rows before ``start`` (a resume's skip) are left out."""
        n = chunk_rows(chunk)
        first, self.read = self.read, self.read + n
        if self.read <= self.start or n == 0:
            return
        if first < self.start:
            cut = self.start - first
            chunk, first = {k: v[cut:] for k, v in chunk.items()}, self.start
        self.chunks.append((first, chunk))

    def take(self, lo: int, hi: int) -> Chunk:
        """Rows ``[lo, hi)`` as one chunk (copies only where the range spans chunks)."""
        if not self.start <= lo < hi <= self.read:
            raise HeteroError(f"rows [{lo}, {hi}) are not held (held: [{self.start}, {self.read}))")
        parts = []
        for first, chunk in self.chunks:
            stop = first + chunk_rows(chunk)
            if stop <= lo or first >= hi:
                continue
            a, b = max(lo, first) - first, min(hi, stop) - first
            parts.append({k: v[a:b] for k, v in chunk.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def drop_below(self, position: int) -> None:
        """Forget the chunks that end at or before ``position`` (a chunk partly above stays)."""
        while self.chunks and self.chunks[0][0] + chunk_rows(self.chunks[0][1]) <= position:
            self.chunks.pop(0)
        self.start = max(self.start, min(position, self.read))


@dataclass
class _Epoch:
    window: RowWindow
    chunks: Iterator[Chunk]
    first_step_start: int
    latest: dict[int, int] = field(default_factory=dict)
    ended: bool = False


class EpochStreams:
    """Serves the ranks' row ranges of every epoch from one pass over its stream.

    Args:
        rows: Rows every epoch has (counted once when the run started).
        world_size: Ranks reading (each one asks for every step, in order).
        open_epoch: ``fn(epoch) -> iterator of column chunks``: one pass over the data.
    """

    def __init__(
        self, rows: int, world_size: int, open_epoch: Callable[[int], Iterator[Chunk]]
    ) -> None:
        if rows < 1:
            raise DataError("the dataset to carve has no rows")
        self.rows = rows
        self.world_size = world_size
        self._open = open_epoch
        self._epochs: dict[int, _Epoch] = {}
        self._rank_epoch: dict[int, int] = {}
        #: Most rows held at once over all epochs (for tests and logs: the memory bound).
        self.peak_held = 0

    def take(self, epoch: int, step_start: int, lo: int, hi: int, rank: int) -> Chunk:
        """Rank ``rank``'s rows ``[lo, hi)`` of ``epoch``, in the step starting at ``step_start``.

        The first request of an epoch opens its stream; a first request past step 0 (a resume
        mid-epoch) skips the stream's first ``step_start`` rows. Every rank resumes at the same
        step, so nothing before it is asked for.
        """
        if not 0 <= step_start <= lo < hi <= self.rows:
            raise HeteroError(f"bad row range [{lo}, {hi}) of a step at {step_start}")
        state = self._epoch(epoch, step_start)
        state.latest[rank] = step_start
        self._rank_epoch[rank] = epoch
        self._read_to(epoch, state, hi)
        rows = state.window.take(lo, hi)
        state.window.drop_below(
            min(state.latest.get(r, state.first_step_start) for r in range(self.world_size))
        )
        self._forget_finished()
        return rows

    def _epoch(self, epoch: int, step_start: int) -> _Epoch:
        state = self._epochs.get(epoch)
        if state is not None:
            return state
        for older, previous in self._epochs.items():
            if older < epoch:  # a later epoch's pass starts after the earlier one's ended
                self._read_to(older, previous, self.rows)
        state = _Epoch(RowWindow(start=step_start), self._open(epoch), step_start)
        self._epochs[epoch] = state
        return state

    def _read_to(self, epoch: int, state: _Epoch, position: int) -> None:
        window = state.window
        while window.read < position:
            chunk = next(state.chunks, None)
            if chunk is None:
                raise DataError(
                    f"epoch {epoch} of the Ray Data stream ended after {window.read} rows; the "
                    f"run counted {self.rows} when it started. Every epoch must yield the same "
                    "rows (a random filter or a changing source breaks exactly-once)."
                )
            window.append(chunk)
            self.peak_held = max(self.peak_held, window.held)
        if window.read > self.rows or (window.read == self.rows and not state.ended):
            extra = window.read - self.rows
            if extra == 0:
                extra = sum(chunk_rows(c) for c in state.chunks)  # the pass must end here
            state.ended = True
            if extra:
                raise DataError(
                    f"epoch {epoch} of the Ray Data stream yielded more rows than the {self.rows} "
                    "counted when the run started. Every epoch must yield the same rows."
                )

    def _forget_finished(self) -> None:
        if len(self._rank_epoch) < self.world_size:
            return
        oldest_in_use = min(self._rank_epoch.values())
        for epoch in [e for e in self._epochs if e < oldest_in_use]:
            del self._epochs[epoch]
