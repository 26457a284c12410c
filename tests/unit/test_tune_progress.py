"""The live view of ``tune.allocation: auto``: each running trial's allocation, printed as it
changes (:class:`~raytrain_hetero.tune.progress.AllocationProgress`), driven by a real
:class:`~raytrain_hetero.tune.allocator.TrialAllocator` object (no Ray)."""

from __future__ import annotations

import functools
import io
import pickle
from collections import Counter

from raytrain_hetero.config.allocation import TrialAllocatorConfig
from raytrain_hetero.core.trial_allocation import ClusterNode, WorkerType
from raytrain_hetero.tune.allocator import TrialAllocator
from raytrain_hetero.tune.progress import AllocationProgress, fetch_holdings, holdings_line

FAST = WorkerType("fast", {"CPU": 1.0}, {"speed": "fast"})
SLOW = WorkerType("slow", {"CPU": 1.0}, {"speed": "slow"})
NODES = [
    ClusterNode("fastnode0123", {"CPU": 2.0}, {"speed": "fast"}),
    ClusterNode("slownode4567", {"CPU": 1.0}, {"speed": "slow"}),
]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _allocator() -> TrialAllocator:
    return TrialAllocator(
        (FAST, SLOW),
        lambda: list(NODES),
        max_epochs=4,
        samples_per_epoch=640,
        config=TrialAllocatorConfig(max_workers_per_trial=2, restart_s=0.0),
    )


def _types(holding) -> str:
    counts = Counter(w.worker_type for w in holding.workers)
    return ", ".join(t + (f"*{k}" if k > 1 else "") for t, k in counts.items())


def test_the_view_prints_each_trials_types_and_nodes_as_they_change_and_when_released():
    alloc = _allocator()
    clock = Clock()
    out = io.StringIO()
    view = AllocationProgress(alloc.holdings, stream=out, min_interval_s=2.0, clock=clock)
    assert view.poll() == []  # nothing registered yet: nothing printed
    a = alloc.request("a", global_batch=64)
    assert a is not None and len(a.workers) == 2  # the cap
    lines = view.poll(force=True)
    assert len(lines) == 2
    nodes = len(set(a.nodes))
    assert lines[0].startswith(
        f"allocation: a v1 2 workers ({_types(a)}) on {nodes} node{'s' if nodes > 1 else ''} ("
    )
    assert lines[0].endswith(f": {a.reason}")
    assert all(n[:8] in lines[0] for n in a.nodes) and "fastnode0" not in lines[0]
    assert lines[1] == f"allocation now: a {_types(a)}"
    assert out.getvalue().splitlines() == lines
    # Unchanged: nothing more is printed.
    clock.now = 5.0
    assert view.poll() == []
    # b arrives and takes the third worker.
    b = alloc.request("b", global_batch=64)
    assert b is not None and len(b.workers) == 1
    clock.now = 6.0
    assert view.poll() == []  # within min_interval_s of the last read
    clock.now = 8.0
    lines = view.poll()
    a_now = alloc.holding("a")
    assert a_now is not None
    # Every trial whose holding changed (a, if b's arrival re-balanced it), then b.
    changed = ["a"] if a_now.version != a.version else []
    assert [line.split(" ")[1] for line in lines[:-1]] == [*changed, "b"]
    assert lines[-2].startswith(f"allocation: b v1 1 worker ({_types(b)}) on 1 node (")
    assert lines[-1] == f"allocation now: a {_types(a_now)} | b {_types(b)}"
    # a ends; at b's epoch end b grows into a's workers: a's release, b's new holding.
    alloc.release("a")
    grown = alloc.epoch_ended("b", 1)
    assert grown is not None and grown.version == 2 and len(grown.workers) == 2
    clock.now = 20.0
    lines = view.poll()
    assert lines[0] == "allocation: a released its workers"
    assert lines[1].startswith(f"allocation: b v2 2 workers ({_types(grown)}) on ")
    assert lines[2] == f"allocation now: b {_types(grown)}"
    alloc.release("b")
    assert view.poll(force=True) == [
        "allocation: b released its workers",
        "allocation now: -",
    ]


def test_a_failing_read_prints_nothing_and_the_view_pickles():
    def broken():
        raise RuntimeError("the allocator is gone")

    out = io.StringIO()
    view = AllocationProgress(broken, stream=None, clock=Clock())
    assert view.poll(force=True) == []
    assert out.getvalue() == ""
    # Tune saves its run config (callbacks included): the view must pickle.
    # raytrain-hetero tune passes functools.partial(fetch_holdings, <the actor's handle>).
    view = AllocationProgress(functools.partial(fetch_holdings, "handle"), min_interval_s=3.0)
    restored = pickle.loads(pickle.dumps(view))
    assert restored.poll(force=True) == []  # "handle" has no holdings(): nothing printed


def test_holdings_line_without_running_trials():
    assert holdings_line([]) == "allocation now: -"
