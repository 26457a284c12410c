"""The figures of ``benchmarks.tune_asha`` as verdicts and a Markdown table.

:func:`verdicts`: each contender's makespan against ``fixed``'s and the done-when of issues 34
(``auto`` >= 1.3x ``fixed``, best accuracy within 0.5 pt) and 44 (with promotions replayed,
``auto`` at most 1.03x ``fixed``'s makespan); :func:`format_table`: the table, the CPU check,
the replay and the simulator's check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from benchmarks.tune_check import format_check

__all__ = [
    "TARGET_ACCURACY_PT",
    "TARGET_MAKESPAN_VS_FIXED",
    "TARGET_NEVER_SLOWER",
    "format_table",
    "num",
    "verdicts",
]

#: Done-when of issue 34 item 4.
TARGET_MAKESPAN_VS_FIXED = 1.3
TARGET_ACCURACY_PT = 0.5
#: Done-when of issue 44 (promotions replayed): auto's makespan at most this times fixed's.
TARGET_NEVER_SLOWER = 1.03


def verdicts(results: Mapping[str, Mapping[str, Any]], *, replayed: bool = False) -> dict[str, Any]:
    """Ratios to ``fixed`` and the done-when (with ``replayed`` promotions also issue 44's:
    ``auto`` never slower than ``fixed``, within :data:`TARGET_NEVER_SLOWER`)."""
    fixed = results.get("fixed")
    out: dict[str, Any] = {}
    for name, figures in results.items():
        if fixed and figures.get("makespan_s"):
            figures_ratio = fixed["makespan_s"] / figures["makespan_s"]
            out[name] = {"fixed_makespan_over_this": figures_ratio}
    auto = results.get("auto")
    if fixed and auto and auto.get("best_accuracy") is not None:
        gap = 100 * ((fixed.get("best_accuracy") or 0.0) - auto["best_accuracy"])
        ratio = out["auto"]["fixed_makespan_over_this"]
        out["done_when"] = {
            "makespan_vs_fixed": ratio,
            "makespan_met": ratio >= TARGET_MAKESPAN_VS_FIXED,
            "accuracy_gap_pt": gap,
            "accuracy_met": gap <= TARGET_ACCURACY_PT,
            "replayed": replayed,
            "auto_over_fixed": 1.0 / ratio,
            "never_slower_met": replayed and 1.0 / ratio <= TARGET_NEVER_SLOWER,
        }
    return out


def format_table(result: Mapping[str, Any]) -> str:
    """The table, the CPU check and the done-when, as Markdown."""
    setup = result["setup"]
    results = result["contenders"]
    ratios = result["verdicts"]
    lines = [
        f"# ASHA search, {setup['trials']} trials x {setup['epochs']} epochs, "
        f"{setup['fast_nodes']} fast + {setup['slow_nodes']} slow worker nodes "
        "(EMULATED speeds)",
        "",
        f"EMULATED: a worker on a fast node runs {setup['fast_factor']:g}x slower than this "
        f"CPU, on a slow node {setup['slow_factor']:g}x (the node's `speed` label decides, in "
        f"all three); all workers computing at once need {result['emulated_cores']:.2f} cores "
        "of emulated compute (loading, collectives and Ray add to it).",
        "",
        "| contender | makespan s | best reaches final acc. s | best acc. | completed | "
        "epochs per trial | fixed/this makespan |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, f in results.items():
        ratio = ratios.get(name, {}).get("fixed_makespan_over_this")
        lines.append(
            f"| {name} | {f['makespan_s']:.0f} | {num(f['best_time_s'], '.0f')} | "
            f"{num(f['best_accuracy'], '.4f')} | {f['completed']}/{f['trials']} | "
            f"{' '.join(str(e) for e in f['epochs_per_trial'])} | {num(ratio, '.2f')} |"
        )
    lines += [
        "",
        "CPU check (this machine: "
        f"{result['machine'].get('logical_cpus')} cores; sampled every 2 s during each search):",
        "",
        "| contender | load1 mean / max | this tree's cores mean / max | machine busy cores mean "
        "| per type: median samples/s (x factor) | fast/slow (expected) |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in results.items():
        cpu, types = f["cpu"], f["per_type"]
        per = ", ".join(
            f"{t} {v['samples_per_s']:.1f} (x{v['factor']:g} = {v['unslowed_samples_per_s']:.0f})"
            for t, v in types.items()
            if isinstance(v, dict) and v.get("factor")
        )
        ratio = (
            f"{types['fast_over_slow']:.2f} ({types['expected_fast_over_slow']:.2f})"
            if "fast_over_slow" in types
            else "-"
        )
        lines.append(
            f"| {name} | {num(cpu['load1_mean'], '.2f')} / {num(cpu['load1_max'], '.2f')} | "
            f"{num(cpu['tree_cores_mean'], '.2f')} / {num(cpu['tree_cores_max'], '.2f')} | "
            f"{num(cpu['machine_cores_mean'], '.2f')} | {per or '-'} | {ratio} |"
        )
    lines += [
        "",
        "Per-type samples/s: `auto` and `fixed` from the library's step records "
        "(`workers/<name>/samples_per_s`, slice / busy seconds, in each report; `fixed`'s "
        "workers are all named `any`, so its figure mixes node speeds); `stock` from its own "
        "step logs (slice / batch-to-optimizer-step seconds, which include DDP's wait for "
        "the slowest rank). When the cores are not the limit, `auto`'s x-factor figures "
        "agree across types and fast/slow matches the expected ratio.",
    ]
    done = ratios.get("done_when")
    if done:
        lines += [
            "",
            f"Done-when (issue 34): makespan >= {TARGET_MAKESPAN_VS_FIXED}x better than fixed: "
            f"{done['makespan_vs_fixed']:.2f}x, {'met' if done['makespan_met'] else 'NOT met'}; "
            f"best accuracy within {TARGET_ACCURACY_PT} pt: auto's "
            f"{-done['accuracy_gap_pt']:+.2f} pt against fixed's, "
            f"{'met' if done['accuracy_met'] else 'NOT met'}.",
        ]
        if done.get("replayed"):
            lines += [
                "",
                f"Done-when (issue 44, promotions replayed): auto's makespan <= "
                f"{TARGET_NEVER_SLOWER}x fixed's: {done['auto_over_fixed']:.2f}x, "
                f"{'met' if done['never_slower_met'] else 'NOT met'}.",
            ]
    replay = result.get("replay")
    if replay:
        held = {n: f.get("replay_held") for n, f in results.items()}
        lines += [
            "",
            f"Promotions replayed from {replay['source']} (epochs per trial "
            f"{' '.join(map(str, replay['epochs']))}); each contender ran exactly them: "
            + ", ".join(f"{n} {'yes' if h else 'NO'}" for n, h in held.items())
            + ".",
        ]
    check = result.get("sim_check")
    if check:
        lines += ["", "The simulator against these searches (benchmarks.tune_check):", ""]
        lines += format_check(check).rstrip().splitlines()
    for name, error in (result.get("errors") or {}).items():
        lines += ["", f"{name} FAILED: {error}"]
    lines += ["", "One run per contender, in the order listed; the search is seeded alike."]
    return "\n".join(lines) + "\n"


def num(value: Any, spec: str) -> str:
    """``value`` formatted, ``-`` for None or a non-finite number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)
