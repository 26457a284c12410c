"""What ``python -m benchmarks`` prints and writes: per-fit lines, the table, bench.json, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.epoch_start import epoch_start_lines
from raytrain_hetero.atomic import atomic_write_text

__all__ = ["best_subset_lines", "fit_line", "format_table", "write_outputs"]


def fit_line(fit: dict[str, Any]) -> str:
    f = fit["figures"]
    parts = [f"fit {fit['index']:2d} {fit['contender']:<11}"]
    if "join_latency_s" in fit:
        parts.append(f"join -> first step at full size {fit['join_latency_s']:6.1f} s")
    parts.append(f"{f.get('samples_per_s', float('nan')):8.1f} samples/s")
    if math.isfinite(f.get("efficiency", float("nan"))):
        parts.append(f"eff {f['efficiency']:.3f}")
    if f.get("curve"):
        parts.append(
            f"tta {f.get('tta_s', float('nan')):6.2f} s  final acc {f.get('final_accuracy'):.3f}"
        )
    parts.append(f"slices {f.get('slices')}")
    if math.isfinite(f.get("epoch_start_ratio", float("nan"))):
        parts.append(f"epoch start {f['epoch_start_ratio']:.2f}x median step")
    parts.append(f"wall {fit['wall_s']:.0f} s")
    if fit.get("load_average_1min") is not None:
        parts.append(f"load {fit['load_average_1min']:.1f}")
    if not fit["counted"]:
        parts.append("(warm-up, not counted)")
    return "  ".join(parts)


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, fmt)


def _goal(result: dict[str, Any], contender: str, metric: str) -> str:
    for verdict in result["summary"]["targets"]:
        if verdict["contender"] == contender and verdict["metric"] == metric:
            goal = verdict["goal"]
            shown = f"{goal:.0%}" if metric == "overhead" else f"{goal:g}"
            return f" [goal {verdict['op']}{shown}: {'met' if verdict['met'] else 'NOT met'}]"
    return ""


def ideal_speedup(result: dict[str, Any]) -> float:
    """Samples/s of uneven slices over equal ones for the run's emulated speeds 1/factor:
    sum of the speeds over (workers x the slowest speed); NaN without emulated workers."""
    speeds = [1.0 / float(w["emulated_slowdown"]) for w in result.get("workers") or []]
    return sum(speeds) / (len(speeds) * min(speeds)) if speeds else math.nan


def ideal_clock_ratio(result: dict[str, Any]) -> float:
    """Stock's (time to accuracy + start-up) over (that time / the ideal speed-up + the same
    start-up): the best time to accuracy including start-up any contender can reach."""
    stock = result["summary"]["contenders"].get("stock", {})
    tta, startup = stock.get("tta_s", math.nan), stock.get("startup_s", math.nan)
    return (tta + startup) / (tta / ideal_speedup(result) + startup)


def format_table(result: dict[str, Any]) -> str:
    """The printed table: medians per contender, ratios to stock, targets beside figures."""
    summary = result["summary"]["contenders"]
    options = result["options"]
    factors = ", ".join(format(w["emulated_slowdown"], "g") for w in result.get("workers") or [])
    kind = (
        f"EMULATED heterogeneity (compute stretched by per-worker factors {factors or '?'})"
        if result["emulated"]
        else "REAL hardware, no emulation"
    )
    machine = result["machine"]
    lines = [
        f"scenario {result['scenario']}: {result['description']}",
        (
            f"{kind}; medians of {options['repeats']} repeat(s) ({_seeds(options)}), "
            "contenders alternating; "
            f"global batch {options['global_batch_size']}, SmallCNN width {options['width']}"
        ),
        (
            f"machine: {machine.get('cpu_model')}, {machine.get('usable_cpus')} usable CPUs, "
            f"GPUs {machine.get('gpus') or 'none'}; 1-min load average {_loads(result)}"
        ),
    ]
    if options.get("scheduler"):
        lines.append(
            f"scheduler settings of the raytrain_hetero contenders: {options['scheduler']}"
        )
    lines.append("")
    join = any("join_latency_s" in f for f in result["fits"])
    if join:
        columns = [
            ("contender", 12, lambda n, r: n),
            (
                "join->first step at full size (s)",
                34,
                lambda n, r: _num(r.get("join_latency_s"), ".1f"),
            ),
            (
                "vs stock (s)",
                12,
                lambda n, r: (
                    _num(
                        r.get("join_latency_s", math.nan)
                        - summary.get("stock", {}).get("join_latency_s", math.nan),
                        "+.1f",
                    )
                    if n != "stock"
                    else ""
                ),
            ),
            ("wall s", 7, lambda n, r: _num(r.get("wall_s"), ".0f")),
        ]
    else:
        target = options["target_accuracy"]
        ideal = ideal_clock_ratio(result)
        if math.isfinite(ideal):
            lines[-1:-1] = [
                f"ideal clock ratio {ideal:.2f}x: stock's (time to {target:.2f} + start-up) "
                f"over (its time to {target:.2f} / the ideal speed-up "
                f"{ideal_speedup(result):.2f}x + its start-up)"
            ]
        columns = [
            ("contender", 12, lambda n, r: n),
            ("incl. start-up (s)", 18, lambda n, r: _num(r.get("tta_total_s"), ".1f")),
            ("x stock", 7, lambda n, r: _num(r.get("tta_total_speedup"), ".2f")),
            (
                "of ideal clock",
                14,
                lambda n, r: _num(r.get("tta_total_speedup", math.nan) / ideal, ".2f"),
            ),
            (
                "at stock's steps",
                16,
                lambda n, r: (
                    _num(r.get("tta_total_at_stock_steps_speedup"), ".2f")
                    + f" ({_num(r.get('tta_total_at_stock_steps_speedup', math.nan) / ideal, '.2f')})"
                ),
            ),
            ("start-up (s)", 12, lambda n, r: _num(r.get("startup_s"), ".1f")),
            (
                "samples/s (range)",
                9,
                lambda n, r: (
                    _num(r.get("samples_per_s"), ".1f")
                    + (
                        f" ({r['samples_per_s_min']:.0f}-{r['samples_per_s_max']:.0f})"
                        if r.get("repeats", 0) > 1 and "samples_per_s_min" in r
                        else ""
                    )
                ),
            ),
            (
                "x stock",
                8,
                lambda n, r: _num(r.get("speedup"), ".2f") + _goal(result, n, "speedup"),
            ),
            (
                "x best-subset",
                13,
                lambda n, r: (
                    _num(r.get("vs_best_subset"), ".2f") + _goal(result, n, "vs_best_subset")
                ),
            ),
            (
                "efficiency",
                10,
                lambda n, r: _num(r.get("efficiency"), ".3f") + _goal(result, n, "efficiency"),
            ),
            (
                f"time to {target:.2f} (s)",
                16,
                lambda n, r: (
                    _num(r.get("tta_s"), ".1f")
                    + (
                        f" [{r.get('reached_target')}/{r.get('repeats')} reached]"
                        if r.get("reached_target") != r.get("repeats")
                        else ""
                    )
                ),
            ),
            ("steps", 5, lambda n, r: _num(r.get("steps_to_target"), ".0f")),
            (
                "x stock",
                8,
                lambda n, r: _num(r.get("tta_speedup"), ".2f") + _goal(result, n, "tta_speedup"),
            ),
            ("final acc", 9, lambda n, r: _num(r.get("final_accuracy"), ".3f")),
            ("wall s", 6, lambda n, r: _num(r.get("wall_s"), ".0f")),
        ]
        if any(v["metric"] == "overhead" for v in result["summary"]["targets"]):
            columns.insert(
                3,
                (
                    "overhead",
                    8,
                    lambda n, r: (
                        (_num(r.get("overhead"), "+.1%") if n != "stock" else "")
                        + _goal(result, n, "overhead")
                    ),
                ),
            )
        if any("samples_per_s_after" in r for r in summary.values()):
            columns[5:5] = [
                ("before", 8, lambda n, r: _num(r.get("samples_per_s_before"), ".1f")),
                ("after drift", 11, lambda n, r: _num(r.get("samples_per_s_after"), ".1f")),
                ("eff after", 9, lambda n, r: _num(r.get("efficiency_after"), ".3f")),
            ]
        if any("replans" in r for r in summary.values()):
            columns.insert(-1, ("re-plans", 8, lambda n, r: _num(r.get("replans"), "g")))
    rows = [[fn(name, summary[name]) for _, _, fn in columns] for name in summary]
    widths = [max(w, len(h), *(len(r[i]) for r in rows)) for i, (h, w, _) in enumerate(columns)]
    lines.append(
        "  ".join(
            f"{h:<{w}}" if i == 0 else f"{h:>{w}}"
            for i, ((h, _, _), w) in enumerate(zip(columns, widths))
        )
    )
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(
                f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    if not join:
        lines.append("")
        lines.append(
            "samples/s: steady-state training steps only (start-up, probing and "
            "evaluation excluded); efficiency: ideal time / time, ideal = B / sum of each "
            "worker's samples/s measured alone at its slice; time to accuracy: training "
            "time from the first step ('steps': steps it took); 'incl. start-up' adds "
            "model preparation and (raytrain_hetero) probing; 'at stock's steps': the same "
            "with each fit's time per step times stock's median steps (x stock, and in "
            "brackets of the ideal clock), no credit for needing fewer steps."
        )
    drift = _drift_lines(summary)
    if drift:
        lines += ["", *drift]
    subset = best_subset_lines(result)
    if subset:
        lines += ["", *subset]
    starts = epoch_start_lines(result)
    if starts:
        lines += ["", *starts]
    verdicts = result["summary"]["targets"]
    if verdicts:
        lines.append("")
        lines.append("targets:")
        for v in verdicts:
            figure = v["figure"]
            shown = _num(figure, "+.1%" if v["metric"] == "overhead" else ".3f")
            note = f" ({v['note']})" if v["note"] else ""
            lines.append(
                f"  {v['contender']:<11} {v['target']}: {shown}{note} -> "
                f"{'met' if v['met'] else 'NOT MET'}"
            )
    return "\n".join(lines)


def best_subset_lines(result: dict[str, Any]) -> list[str]:
    """What the best-subset search found, and the defaults' ratio to it."""
    from benchmarks.scenarios import DEFAULTS

    search = result.get("best_subset")
    if not search:
        return []
    row = result["summary"]["contenders"].get(DEFAULTS, {})
    lines = [
        f"best-subset: {', '.join(search['chosen'])} (screened over {search['screen_steps']} "
        f"steps each; the library's defaults ({DEFAULTS}) at "
        f"{_num(row.get('vs_best_subset'), '.2f')}x of it):"
    ]
    for c in search["candidates"]:
        figure = (
            f"{c['samples_per_s']:.1f} samples/s"
            if c.get("samples_per_s") is not None
            else f"not screened: {c.get('skipped')}"
        )
        bound = f" (bound {c['bound']:.1f})" if c.get("bound") is not None else ""
        lines.append(f"  {', '.join(c['names'])}: {figure}{bound}")
    return lines


def _drift_lines(summary: dict[str, Any]) -> list[str]:
    """After the injection, against the side-by-side static post-drift plan."""
    reference = summary.get("hetero-static-post", {}).get("samples_per_s")
    rows = [(n, r) for n, r in summary.items() if "vs_static_post_steady" in r]
    if reference is None or not rows:
        return []
    lines = [
        f"after the slowdown, against hetero-static-post (a static plan probed at the "
        f"post-drift speeds, same run): {reference:.1f} samples/s",
        f"  {'contender':<12} {'transition (steps)':>18} {'samples/s in it':>15} "
        f"{'steady samples/s':>16} {'x static-post':>13} {'x from +30 steps':>16} "
        f"{'re-plans':>8}",
    ]
    for name, r in rows:
        transition = _num(r.get("transition_steps"), ".0f")
        if r.get("recovered") != r.get("repeats"):
            transition += f" ({r.get('recovered')}/{r.get('repeats')} recovered)"
        lines.append(
            f"  {name:<12} {transition:>18} {_num(r.get('samples_per_s_transition'), '.1f'):>15} "
            f"{_num(r.get('samples_per_s_steady'), '.1f'):>16} "
            f"{_num(r.get('vs_static_post_steady'), '.3f'):>13} "
            f"{_num(r.get('vs_static_post_after_30'), '.3f'):>16} "
            f"{_num(r.get('replans'), 'g'):>8}"
        )
    lines.append(
        "  transition: steps from the injection until a 3-step rolling median of samples/s "
        "stays within 10% of hetero-static-post's; steady: the steps after it"
    )
    return lines


def _loads(result: dict[str, Any]) -> str:
    """The machine's 1-minute load average at the start, after each fit (range) and the end."""
    machine = result["machine"]
    start = (machine.get("load_average") or [math.nan])[0]
    fits = [
        f["load_average_1min"] for f in result["fits"] if f.get("load_average_1min") is not None
    ]
    during = f", {min(fits):.1f}-{max(fits):.1f} after fits" if fits else ""
    return f"{_num(start, '.1f')} at start{during} (the machine is shared)"


def _json_default(value: Any) -> Any:
    try:
        import numpy as np

        if isinstance(value, (np.integer, np.floating)):
            return value.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_outputs(result: dict[str, Any], output: Path) -> list[Path]:
    """bench.json, COMMAND and the plots."""
    from benchmarks.plots import (
        plot_accuracy,
        plot_throughput,
        plot_timeline,
    )

    output.mkdir(parents=True, exist_ok=True)
    written = []
    path = output / "bench.json"
    atomic_write_text(path, json.dumps(result, indent=2, default=_json_default, allow_nan=True))
    written.append(path)
    atomic_write_text(output / "COMMAND", result["command"] + "\n")
    written.append(output / "COMMAND")
    if not result.get("skipped"):
        atomic_write_text(output / "table.txt", format_table(result) + "\n")
        written.append(output / "table.txt")
    if result.get("skipped"):
        return written
    join = any("join_latency_s" in f for f in result["fits"])
    if not join:
        written.append(plot_throughput(result, output / "throughput.png"))
        written.append(plot_accuracy(result, output / "accuracy.png"))
    if result["schedule"]:
        step = min(int(i.get("from_step", 0)) for i in result["schedule"])
        written.append(
            plot_timeline(
                result, output / "timeline.png", marker=step, marker_label="slowdown injected"
            )
        )
    if join:
        written.append(
            plot_timeline(
                result, output / "timeline.png", marker=0.0, marker_label="node joined", x="join"
            )
        )
    return written


def _seeds(options: dict[str, Any]) -> str:
    """What the repeats' seeds were, e.g. ``seeds 0-2: one data order ... per repeat``."""
    if "seed" not in options:  # a run from before per-repeat seeds
        return "seed 0 in every repeat: one data order and model init for all fits"
    first = int(options["seed"])
    last = first + int(options["repeats"]) - 1
    seeds = str(first) if last == first else f"{first}-{last}"
    return f"seeds {seeds}: one data order and model init per repeat, the same for every contender"
