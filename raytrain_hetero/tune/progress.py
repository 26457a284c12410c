"""The live view of a search's allocation (``tune.allocation: auto``): which workers each
running trial holds, printed as it changes.

:class:`AllocationProgress` is a Ray Tune callback (``RunConfig(callbacks=[...])``) on the
search's driver: at most every ``min_interval_s`` of Tune's loop it reads what every live
trial holds (:meth:`~raytrain_hetero.tune.allocator.TrialAllocator.holdings`, through an
injected ``fetch``) and, when a trial's holding is new, changed or gone, prints one line per
change and then one line with every running trial's current holding, e.g.::

    allocation: 613b2_00001 v2 3 workers (fast*2, slow) on 2 nodes (1a2b3c4d*2, 5e6f7a8b): ...
    allocation now: 613b2_00001 fast*2, slow | 613b2_00003 slow
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ray.tune import Callback

from raytrain_hetero.tune.allocator import TrialHolding

__all__ = ["AllocationProgress", "fetch_holdings", "holding_text", "holdings_line"]

logger = logging.getLogger(__name__)


def _counts(values: Sequence[str], *, short: bool = False) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(
        (v[:8] if short else v) + (f"*{k}" if k > 1 else "") for v, k in counts.items()
    )


def holding_text(holding: TrialHolding) -> str:
    """One trial's holding: ``v<version> <n> worker(s) (<type>[*k], ...) on <m> node(s)
    (<node8>[*k], ...)``, types and nodes in slot order, node ids shortened to 8 characters."""
    n = len(holding.workers)
    types = _counts([w.worker_type for w in holding.workers])
    nodes = _counts(list(holding.nodes), short=True)
    unique = len(set(holding.nodes))
    return (
        f"v{holding.version} {n} worker{'s' if n != 1 else ''} ({types}) on {unique} "
        f"node{'s' if unique != 1 else ''} ({nodes})"
    )


def holdings_line(holdings: Sequence[TrialHolding]) -> str:
    """Every running trial's current worker types, one line (``-`` when none holds any)."""
    if not holdings:
        return "allocation now: -"
    parts = [f"{h.trial_id} {_counts([w.worker_type for w in h.workers])}" for h in holdings]
    return "allocation now: " + " | ".join(parts)


def fetch_holdings(allocator: Any, timeout_s: float = 10.0) -> tuple[TrialHolding, ...]:
    """What the allocator actor says every live trial holds."""
    import ray

    return tuple(ray.get(allocator.holdings.remote(), timeout=timeout_s))


class AllocationProgress(Callback):
    """Tune callback: prints each running trial's allocation when it changes.

    Args:
        fetch: Returns the live trials' holdings (``functools.partial(fetch_holdings,
            allocator)`` in ``raytrain-hetero tune``; a picklable callable, since Tune saves
            its run config).
        stream: Where to print (None: ``sys.stdout`` at the time of printing).
        min_interval_s: Least seconds between two reads of the allocator.
        clock: Seconds (injected; ``time.monotonic``).
    """

    def __init__(
        self,
        fetch: Callable[[], Sequence[TrialHolding]],
        *,
        stream: TextIO | None = None,
        min_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._stream = stream
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_poll: float | None = None
        self._shown: dict[str, int] = {}  # trial id -> holding version shown

    def poll(self, *, force: bool = False) -> list[str]:
        """Read the holdings (unless read less than ``min_interval_s`` ago) and print the
        changes since the last read; returns the printed lines."""
        now = self._clock()
        if (
            not force
            and self._last_poll is not None
            and now - self._last_poll < self._min_interval_s
        ):
            return []
        self._last_poll = now
        try:
            holdings = list(self._fetch())
        except Exception as exc:  # noqa: BLE001 - the view must never stop the search
            logger.debug("no allocation to show: %s", exc)
            return []
        lines = []
        current = {h.trial_id: h for h in holdings}
        for trial_id in [t for t in self._shown if t not in current]:
            lines.append(f"allocation: {trial_id} released its workers")
            del self._shown[trial_id]
        for holding in holdings:
            if self._shown.get(holding.trial_id) == holding.version:
                continue
            self._shown[holding.trial_id] = holding.version
            lines.append(
                f"allocation: {holding.trial_id} {holding_text(holding)}: {holding.reason}"
            )
        if lines:
            lines.append(holdings_line(holdings))
            stream = self._stream or sys.stdout
            for line in lines:
                print(line, file=stream, flush=True)
        return lines

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """Tune's loop turned: show changes (rate-limited)."""
        self.poll()

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        """A trial reported (an epoch ended: moves happen here): show changes."""
        self.poll(force=True)
