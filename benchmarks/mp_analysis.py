"""Figures of the model-parallel benchmarks from their raw per-contender timings (pure).

Definitions (conv-split), for a worker group with EMULATED speeds ``s_i = 1 / factor_i``:

* speed-up of a contender = time of a step of the fastest worker alone / its step time
  (``conv`` variant: the conv layers' time only);
* ideal speed-up = ``sum(s_i) / max(s_i)`` (every worker busy all the time, no traffic);
* efficiency = speed-up / ideal speed-up ("fraction of the sum of worker speeds");
* proportional vs equal = equal split's step time / proportional split's.

Bandwidth crossover (delays in ms per MB: 1 ms/MB is a 1 GB/s link, 8 ms/MB about 1 GbE):
with an emulated link of ``d`` seconds per byte, a contender's step
takes about ``t0 + d * b`` (``b`` = bytes a worker sends per step). Conv split (``s``) and data
parallelism (``p``) cross at ``d* = (t0_p - t0_s) / (b_s - b_p)`` when the split is faster on
a free link but moves more bytes; below that bandwidth (``1 / d*`` bytes/s) data
parallelism wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "conv_split_figures",
    "crossover_delay",
    "ideal_speedup",
    "measured_crossover",
]

#: The paper-derived targets printed beside the figures.
CONV_EFFICIENCY_TARGET = 0.85
CONV_EFFICIENCY_MIN_BATCH = 128
PROPORTIONAL_OVER_EQUAL_TARGET = 1.5
PAPER_WIDTH = 500


def ideal_speedup(factors: Sequence[float]) -> float:
    """``sum(speeds) / max(speeds)`` for EMULATED slowdown factors (speed = 1 / factor)."""
    speeds = [1.0 / float(f) for f in factors]
    return sum(speeds) / max(speeds)


def crossover_delay(
    split_s: float, data_s: float, split_bytes: float, data_bytes: float
) -> float | None:
    """Seconds per byte (per worker) at which data parallelism starts to win, or None.

    None when no positive crossover exists: data parallelism is already at least as fast on a
    free link and moves no more bytes (it wins at every bandwidth), or the split moves no more
    bytes and is faster (the split wins at every bandwidth).
    """
    if split_bytes <= data_bytes:
        return None
    delay = (data_s - split_s) / (split_bytes - data_bytes)
    return delay if delay > 0 else None


def measured_crossover(sweep: Sequence[dict[str, Any]]) -> float | None:
    """The smallest swept delay (ms/MB) at which data parallelism's step beat the split's."""
    for entry in sorted(sweep, key=lambda e: e["delay_ms_per_mb"]):
        if entry["data_s"] < entry["proportional_s"]:
            return float(entry["delay_ms_per_mb"])
    return None


def _by_name(contenders: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["contender"]: c for c in contenders}


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or b <= 0:
        return math.nan
    return a / b


def conv_split_figures(run: dict[str, Any]) -> dict[str, Any]:
    """Rows (per batch and contender) and the sweep summary of one worker configuration.

    Args:
        run: What the conv-split loop wrote: ``factors``, ``width``, ``measured`` (per batch,
            per contender ``step_s``, ``conv_s``, ``bytes_per_step``, kernels, slices) and
            ``sweep`` (per delay, the proportional split and data parallelism).
    """
    factors = [float(f) for f in run["factors"]]
    ideal = ideal_speedup(factors)
    rows = []
    for batch in run["measured"]:
        named = _by_name(batch["contenders"])
        alone = named.get("alone")
        for c in batch["contenders"]:
            speedup = _ratio(alone and alone["step_s"], c["step_s"])
            conv_speedup = _ratio(alone and alone["conv_s"], c["conv_s"])
            rows.append(
                {
                    "batch": batch["batch"],
                    "contender": c["contender"],
                    "step_s": c["step_s"],
                    "conv_s": c["conv_s"],
                    "speedup": speedup,
                    "conv_speedup": conv_speedup,
                    "efficiency": speedup / ideal,
                    "conv_efficiency": conv_speedup / ideal,
                    "bytes_per_step": c["bytes_per_step"],
                    "kernels": c.get("kernels") or {},
                    "slices": c.get("slices") or [],
                }
            )
    ratios = []
    for batch in run["measured"]:
        named = _by_name(batch["contenders"])
        if "equal" in named and "proportional" in named:
            ratios.append(
                {
                    "batch": batch["batch"],
                    "step": _ratio(named["equal"]["step_s"], named["proportional"]["step_s"]),
                    "conv": _ratio(named["equal"]["conv_s"], named["proportional"]["conv_s"]),
                }
            )
    sweep = []
    for entry in run.get("sweep", []):
        named = _by_name(entry["contenders"])
        split, data = named["proportional"], named["data"]
        sweep.append(
            {
                "batch": entry["batch"],
                "delay_ms_per_mb": split["delay_ms_per_mb"],
                "proportional_s": split["step_s"],
                "data_s": data["step_s"],
                "proportional_bytes": split["bytes_per_step"],
                "data_bytes": data["bytes_per_step"],
            }
        )
    predicted = None
    free = [e for e in sweep if e["delay_ms_per_mb"] == 0]
    if free:
        world = len(factors)
        delay = crossover_delay(
            free[0]["proportional_s"],
            free[0]["data_s"],
            free[0]["proportional_bytes"] / world,
            free[0]["data_bytes"] / world,
        )
        predicted = None if delay is None else delay * 1e9
    return {
        "factors": factors,
        "ideal_speedup": ideal,
        "width": run["width"],
        "rows": rows,
        "proportional_over_equal": ratios,
        "sweep": sweep,
        "crossover_ms_per_mb_measured": measured_crossover(sweep),
        "crossover_ms_per_mb_predicted": predicted,
    }


def conv_split_targets(config_figures: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verdicts of the two conv-split targets over every measured configuration."""
    verdicts = []
    for fig in config_figures:
        label = fig["label"]
        paper = fig["width"] >= PAPER_WIDTH
        for row in fig["rows"]:
            if row["contender"] != "proportional" or row["batch"] < CONV_EFFICIENCY_MIN_BATCH:
                continue
            verdicts.append(
                {
                    "target": f"conv split >= {CONV_EFFICIENCY_TARGET} of the sum of worker "
                    f"speeds on the conv layers at batch >= {CONV_EFFICIENCY_MIN_BATCH}",
                    "config": label,
                    "batch": row["batch"],
                    "figure": row["conv_efficiency"],
                    "met": row["conv_efficiency"] >= CONV_EFFICIENCY_TARGET,
                    "at_paper_shapes": paper,
                }
            )
        spread = max(fig["factors"]) / min(fig["factors"])
        if spread >= 4:
            for ratio in fig["proportional_over_equal"]:
                verdicts.append(
                    {
                        "target": f"proportional >= {PROPORTIONAL_OVER_EQUAL_TARGET}x equal split "
                        "at 4x speed difference (whole step)",
                        "config": label,
                        "batch": ratio["batch"],
                        "figure": ratio["step"],
                        "met": ratio["step"] >= PROPORTIONAL_OVER_EQUAL_TARGET,
                        "at_paper_shapes": paper,
                    }
                )
    return verdicts


def branches_targets(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verdict of the branch target: branch placement moves fewer bytes per step than DP."""
    return [
        {
            "target": "branch placement moves fewer bytes per step than data parallelism",
            "config": f"{run['world']} workers",
            "figure": _ratio(
                run["contenders"]["branches"]["bytes_per_step"],
                run["contenders"]["data"]["bytes_per_step"],
            ),
            "met": run["contenders"]["branches"]["bytes_per_step"]
            < run["contenders"]["data"]["bytes_per_step"],
        }
        for run in runs
    ]
