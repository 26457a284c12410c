"""``python -m benchmarks.seed_table DIR [DIR ...]``: each repeat (seed) of a scenario run apart.

The scenario table (``table.txt``) shows medians over repeats; the done-when of issue 35 asks
for some figures *in every seed* (the clock including start-up against the ideal, the final
accuracy against stock's). This prints, per scenario directory (a ``bench.json`` written by
``python -m benchmarks SCENARIO``) and per repeat, each contender against that repeat's stock
fit: samples/s over stock's, time to the target accuracy including start-up over stock's and
as a share of the ideal clock ratio, and the final accuracy's difference in points; then the
worst seed of each. Markdown, to paste into the docs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.report import ideal_speedup

__all__ = ["seed_rows", "seed_table"]


def _ideal_clock(stock: dict[str, Any], speedup: float) -> float:
    tta, startup = stock.get("tta_s", math.nan), stock.get("startup_s", math.nan)
    return (tta + startup) / (tta / speedup + startup)


def seed_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per counted fit but stock's: its figures against its repeat's stock fit."""
    fits = [f for f in result["fits"] if f.get("counted")]
    stock = {f["repeat"]: f["figures"] for f in fits if f["contender"] == "stock"}
    speedup = ideal_speedup(result)
    rows = []
    for fit in fits:
        base = stock.get(fit["repeat"])
        if fit["contender"] == "stock" or base is None:
            continue
        fig = fit["figures"]
        clock = base.get("tta_total_s", math.nan) / fig.get("tta_total_s", math.nan)
        rows.append(
            {
                "contender": fit["contender"],
                "seed": fit.get("seed", fit["repeat"]),
                "samples_x_stock": fig["samples_per_s"] / base["samples_per_s"],
                "clock_x_stock": clock,
                "of_ideal_clock": clock / _ideal_clock(base, speedup),
                "accuracy_pt": 100.0 * (fig["final_accuracy"] - base["final_accuracy"]),
                "final_accuracy": fig["final_accuracy"],
            }
        )
    return rows


def seed_table(path: Path) -> str:
    """The markdown of one scenario directory."""
    result = json.loads((path / "bench.json").read_text())
    rows = seed_rows(result)
    lines = [
        f"**{result['scenario']}** (`{path}`; ideal speed-up {ideal_speedup(result):.2f}x)",
        "",
        "| contender | seed | samples/s x stock | clock incl. start-up x stock | of ideal clock"
        " | final acc. | vs stock (pt) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["contender"], r["seed"])):
        lines.append(
            f"| {r['contender']} | {r['seed']} | {r['samples_x_stock']:.2f} | "
            f"{r['clock_x_stock']:.2f} | {r['of_ideal_clock']:.2f} | "
            f"{r['final_accuracy']:.3f} | {r['accuracy_pt']:+.1f} |"
        )
    lines += ["", "| contender | worst seed: of ideal clock | worst seed: vs stock (pt) |"]
    lines.append("|---|---:|---:|")
    for name in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == name]
        worst_acc = min((r["accuracy_pt"] for r in mine), key=lambda v: -abs(v))
        lines.append(
            f"| {name} | {min(r['of_ideal_clock'] for r in mine):.2f} | {worst_acc:+.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directories", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(p) for p in args.directories if not (p / "bench.json").is_file()]
    if missing:
        parser.error(
            f"no bench.json in {', '.join(missing)}: pass the --output directory of a "
            "`python -m benchmarks SCENARIO` run (e.g. benchmarks/results/ghost_seeds/hetero2)"
        )
    print("\n".join(seed_table(path) for path in args.directories))


if __name__ == "__main__":
    main()
