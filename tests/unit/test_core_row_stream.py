"""The Ray Data path's row cutting (core/row_stream.py): ranks in near-lockstep asking for the
carving's positions of a streamed epoch get every row once, with a bounded window (pure)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.core.row_stream import EpochStreams, RowWindow
from raytrain_hetero.errors import DataError


def _stream(rows: int, chunk_sizes: list[int], epoch: int):
    """One pass: ids 0..rows-1 (offset per epoch in a second column) in the given chunks."""
    position, i = 0, 0
    while position < rows:
        n = min(chunk_sizes[i % len(chunk_sizes)], rows - position)
        ids = np.arange(position, position + n)
        yield {"id": ids, "x": np.stack([ids, ids + 1000 * epoch], axis=1)}
        position, i = position + n, i + 1


@st.composite
def cases(draw):
    world = draw(st.integers(1, 4))
    batch = draw(st.integers(world, 40))
    rows = draw(st.integers(world, 200))
    carver = EpochCarver(rows, batch, min_step_size=world, shuffle=False)
    chunks = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
    epochs = draw(st.integers(1, 3))
    start_step = draw(st.integers(0, carver.steps_per_epoch - 1))
    switch = draw(st.integers(0, carver.steps_per_epoch * epochs))
    shares = [draw(st.lists(st.floats(0.2, 5.0), min_size=world, max_size=world)) for _ in "ab"]
    order = draw(st.randoms(use_true_random=False))
    return carver, world, chunks, epochs, start_step, switch, shares, order


@settings(max_examples=120, deadline=None)
@given(cases())
def test_ranks_get_every_row_once_per_epoch_with_a_bounded_window(case):
    carver, world, chunks, epochs, start_step, switch, shares, order = case
    batch, rows = carver.global_batch_size, carver.dataset_size
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(batch, shares[0], version=1))
    schedule.add(Plan.from_shares(batch, shares[1], version=2, effective_step=switch))
    streams = EpochStreams(rows, world, lambda e: _stream(rows, chunks, e))
    first = start_step  # a resume at step start_step of epoch 0
    total = carver.steps_per_epoch * epochs
    nxt = dict.fromkeys(range(world), first)
    seen: dict[int, Counter] = {e: Counter() for e in range(epochs)}
    while min(nxt.values()) < total:
        # A rank may run one step ahead of the slowest (prefetch), never more.
        ready = [r for r in range(world) if nxt[r] < total and nxt[r] <= min(nxt.values()) + 1]
        rank = order.choice(ready)
        epoch, k = divmod(nxt[rank], carver.steps_per_epoch)
        plan = schedule.plan_for(nxt[rank])
        lo, hi = carver.rank_positions(k, plan, rank)
        got = streams.take(epoch, carver.step_bounds(k)[0], lo, hi, rank)
        assert got["id"].tolist() == list(range(lo, hi))  # the stream's own order, cut
        assert got["x"][:, 1].tolist() == [i + 1000 * epoch for i in range(lo, hi)]
        seen[epoch].update(got["id"].tolist())
        nxt[rank] += 1
    skipped = carver.step_bounds(first)[0]
    assert seen[0] == Counter(range(skipped, rows))
    for epoch in range(1, epochs):
        assert seen[epoch] == Counter(range(rows))
    # Held: the (at most 2 + 1) steps the ranks span, plus the chunks at both ends of it.
    assert streams.peak_held <= 3 * (batch + world) + 2 * max(chunks)


def test_a_stream_shorter_or_longer_than_counted_is_an_error():
    short = EpochStreams(10, 1, lambda e: _stream(8, [4], e))
    with pytest.raises(DataError, match="ended after 8 rows"):
        short.take(0, 0, 0, 10, 0)
    long = EpochStreams(10, 1, lambda e: _stream(12, [5], e))
    with pytest.raises(DataError, match="more rows"):
        long.take(0, 0, 0, 10, 0)


def test_window_skips_a_resumes_rows_and_drops_whole_chunks():
    window = RowWindow(start=5)
    for ids in (np.arange(0, 4), np.arange(4, 9), np.arange(9, 12)):
        window.append({"id": ids})
    assert window.read == 12 and window.held == 7
    assert window.take(6, 11)["id"].tolist() == [6, 7, 8, 9, 10]
    window.drop_below(10)
    assert window.held == 3 and window.start == 10  # the chunk 9..11 is partly needed
