"""The CPU check of ``benchmarks.tune_asha`` (the machine has few cores, so say what it got).

:class:`CpuMonitor` samples the load average, the machine's busy cores and this process
tree's CPU seconds per second (Ray's raylets and workers are its descendants) during a
search; :func:`hetero_cpu_check` and :func:`stock_cpu_check` give per worker type the median
samples/s and that times the type's EMULATED factor: equal across types when the cores are
not what limits the run.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CpuMonitor", "hetero_cpu_check", "stock_cpu_check", "worker_rates"]


class CpuMonitor:
    """Samples, every ``interval_s`` while running: the 1-minute load average, the machine's
    busy cores (``/proc/stat``) and the CPU seconds per second of this process's tree (Ray's
    raylets and workers are its descendants; a process that ended between two samples loses
    its last interval)."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        before_tree, before_stat, before_t = _tree_ticks(), _machine_ticks(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            tree, stat, now = _tree_ticks(), _machine_ticks(), time.monotonic()
            dt = max(now - before_t, 1e-6)
            used = sum(t - before_tree[p] for p, t in tree.items() if p in before_tree)
            sample = {
                "t": now,
                "load1": os.getloadavg()[0],
                "tree_cores": used / ticks / dt,
            }
            if stat is not None and before_stat is not None:
                busy = (stat[0] - before_stat[0]) / max(stat[1] - before_stat[1], 1)
                sample["machine_cores"] = busy * (os.cpu_count() or 1)
            self.samples.append(sample)
            before_tree, before_stat, before_t = tree, stat, now

    def summary(self) -> dict[str, float | None]:
        """Mean and max of each series (None without samples)."""
        out: dict[str, float | None] = {}
        for key in ("load1", "tree_cores", "machine_cores"):
            values = [s[key] for s in self.samples if key in s]
            out[f"{key}_mean"] = statistics.fmean(values) if values else None
            out[f"{key}_max"] = max(values) if values else None
        return out


def _machine_ticks() -> tuple[int, int] | None:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _tree_ticks() -> dict[int, int]:
    """utime + stime (clock ticks) of this process and every descendant."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2 :].split()
        # rest[0] is the state; ppid, then utime and stime are fields 4, 14, 15 of stat.
        parents[int(entry.name)] = int(rest[1])
        times[int(entry.name)] = int(rest[11]) + int(rest[12])
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in times:
            tree[pid] = times[pid]
        todo.extend(children.get(pid, ()))
    return tree


def worker_rates(row: Mapping[str, Any]) -> dict[str, float]:
    """``{worker name: samples/s}`` of one report (nested or flattened keys)."""
    rates: dict[str, float] = {}
    nested = row.get("workers")
    if isinstance(nested, Mapping):
        for name, values in nested.items():
            if isinstance(values, Mapping) and values.get("samples_per_s") is not None:
                rates[name] = float(values["samples_per_s"])
    for key, value in row.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "workers" and parts[2] == "samples_per_s":
            rates[parts[1]] = float(value)
    return {k: v for k, v in rates.items() if math.isfinite(v) and v > 0}


def hetero_cpu_check(
    reports: Mapping[str, Sequence[Mapping[str, Any]]], factors: Mapping[str, float]
) -> dict[str, Any]:
    """Per worker type (the name before ``-<k>``, ``fast``/``slow`` under ``auto``): the
    median samples/s over every report of every worker, and that times the type's factor (the
    unslowed speed it implies: equal across types when the cores do not limit the run)."""
    rates: dict[str, list[float]] = {}
    for rows in reports.values():
        for row in rows:
            for name, rate in worker_rates(row).items():
                rates.setdefault(name.rsplit("-", 1)[0], []).append(rate)
    return _per_type(rates, factors)


def stock_cpu_check(steps_dir: Path, factors: Mapping[str, float]) -> dict[str, Any]:
    """``stock``'s own step logs: per node speed, the median of each rank's slice over the
    time from its batch in hand to its optimizer step (its compute, stretched, plus the wait
    for the slowest rank in DDP's all-reduce: a fast rank's figure is its group's)."""
    rates: dict[str, list[float]] = {}
    for path in Path(steps_dir).glob("*/rank*.jsonl"):
        for line in path.read_text().splitlines():
            step = json.loads(line)
            span = float(step["end"]) - float(step["start"])
            if span > 0:
                rates.setdefault(str(step["speed"]), []).append(float(step["slice"]) / span)
    return _per_type(rates, factors)


def _per_type(rates: Mapping[str, list[float]], factors: Mapping[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in sorted(rates.items()):
        median = statistics.median(values)
        factor = factors.get(name)
        out[name] = {
            "samples_per_s": median,
            "reports": len(values),
            "factor": factor,
            "unslowed_samples_per_s": median * factor if factor else None,
        }
    fast, slow = out.get("fast"), out.get("slow")
    if fast and slow and slow["samples_per_s"] > 0:
        out["fast_over_slow"] = fast["samples_per_s"] / slow["samples_per_s"]
        out["expected_fast_over_slow"] = factors["slow"] / factors["fast"]
    return out
