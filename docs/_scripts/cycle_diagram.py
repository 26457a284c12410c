"""Draw docs/concepts/cycle.png, the measure -> carve -> weight -> re-plan cycle.

Run from the repository root after changing it: ``python docs/_scripts/cycle_diagram.py``
(the PNG is committed, so the docs build needs no plotting).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "concepts" / "cycle.png"

STAGES = [
    ("1. measure", "each rank times its own\ncompute per step:\nt_i(b) = α_i + β_i·b", (0.2, 0.72)),
    (
        "2. carve",
        "global batch B split into\nslices b_i minimising\nmax_i t_i(b_i), Σ b_i = B",
        (0.8, 0.72),
    ),
    (
        "3. weight",
        "gradient of rank i scaled by\nn_i / Σn, then SUM all-reduce:\nexactly the 1-device update",
        (0.8, 0.22),
    ),
    (
        "4. re-plan",
        "a new plan, versioned, takes\neffect at one agreed step\nwhen it predicts a real gain",
        (0.2, 0.22),
    ),
]


def main() -> None:
    fig = Figure(figsize=(9, 5.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    w, h = 0.34, 0.3
    for title, text, (x, y) in STAGES:
        box = FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.01", fc="#eef3fb", ec="#35608f"
        )
        ax.add_patch(box)
        ax.text(x, y + 0.09, title, ha="center", va="center", fontsize=13, weight="bold")
        ax.text(x, y - 0.04, text, ha="center", va="center", fontsize=9.5)
    arrows = [
        ((0.37, 0.72), (0.63, 0.72)),
        ((0.8, 0.57), (0.8, 0.37)),
        ((0.63, 0.22), (0.37, 0.22)),
        ((0.2, 0.37), (0.2, 0.57)),
    ]
    for start, end in arrows:
        ax.add_patch(
            FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=18, color="#35608f")
        )
    ax.text(
        0.5,
        0.47,
        "every step: carve + weight\nevery window: measure, maybe re-plan",
        ha="center",
        va="center",
        fontsize=9,
        style="italic",
        color="#555555",
    )
    fig.savefig(OUT)


if __name__ == "__main__":
    main()
