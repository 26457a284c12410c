"""Issue 44's device check as a part of ``python -m benchmarks device`` (issue 47's command).

Importing this module registers part ``t`` (:func:`benchmarks.device.register_part`): list it
in ``benchmarks.device.PART_MODULES``. The part runs :func:`benchmarks.tune_device.device_check`
under ``<output>/tune`` (fixed vs auto, promotions replayed, about 330 s estimated on 16
cores; a dry run plans and estimates only) and gives two rows: auto's makespan against
fixed's (issue 44's goal on a lent machine: fixed/auto >= 1.3) and the never-slower verdict
(auto at most 1.03x fixed's makespan). Makespans, not samples/s: the ``samples_per_s``
column holds auto's makespan in seconds, the ratio is fixed's makespan over auto's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from benchmarks.device import DevicePart, DeviceRun, Row, register_part
from benchmarks.tune_device import DEVICE, device_check, plan
from benchmarks.tune_report import TARGET_NEVER_SLOWER

__all__ = ["TUNE_PART", "tune_rows"]

#: Issue 44's goal on a lent 16-core machine: fixed's makespan over auto's.
TARGET_ON_DEVICE = 1.3


def tune_rows(run: DeviceRun) -> list[Row]:
    """Run the tune device check into ``run.output / "tune"``; its rows."""
    out = run.output / "tune"
    code = device_check(out, dry_run=run.dry_run)
    run.results["t"] = {"returncode": code, "dir": str(out)}
    if run.dry_run:
        estimate = plan(out.resolve()).estimate_s
        ratio = estimate["fixed"] / estimate["auto"]
        note = f"dry run: simulated estimate, {DEVICE.worker_nodes} nodes"
        return [
            Row(
                "t", "tune makespan (estimate)", "auto", estimate["auto"], "fixed", ratio, note=note
            )
        ]
    if code != 0 and not (out / "results.json").exists():
        raise RuntimeError(f"the tune device check failed before any search (exit {code})")
    result: dict[str, Any] = json.loads((out / "results.json").read_text())
    run.results["t"]["results"] = result
    figures = result["contenders"]
    fixed = figures.get("fixed", {}).get("makespan_s", math.nan)
    auto = figures.get("auto", {}).get("makespan_s", math.nan)
    ratio = fixed / auto if auto else math.nan
    check = result.get("sim_check") or []
    errors = ", ".join(f"{r['contender']} {r['error']:+.0%}" for r in check)
    note = f"fixed {fixed:.0f} s; simulator error {errors or '-'}"
    return [
        Row(
            "t",
            "tune makespan, promotions replayed",
            "auto",
            auto,
            "fixed",
            ratio,
            f">= {TARGET_ON_DEVICE}",
            ratio >= TARGET_ON_DEVICE,
            note,
        ),
        Row(
            "t",
            "never slower (auto/fixed makespan)",
            "auto",
            auto,
            "fixed",
            1.0 / ratio if ratio else math.nan,
            f"<= {TARGET_NEVER_SLOWER}",
            bool(ratio) and 1.0 / ratio <= TARGET_NEVER_SLOWER,
        ),
    ]


TUNE_PART = register_part(
    DevicePart(
        key="t",
        title="tune: fixed vs auto, ASHA's promotions replayed (issue 44)",
        run=tune_rows,
        estimate_s=330.0,
    )
)
