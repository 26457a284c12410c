"""Draw docs/concepts/cycle.png, the measure -> carve -> weight -> re-plan cycle.

Run from the repository root after changing it: ``python docs/_scripts/cycle_diagram.py``
(the PNG is committed, so the docs build needs no plotting).

Legibility: the pages show the figure at ``DISPLAY_WIDTH_PX`` CSS pixels (the figure
directives in docs/index.md and docs/concepts/how-it-works.md say ``:width: 800px``), one
inch of the figure per ``DISPLAY_WIDTH_PX / FIGSIZE[0]`` CSS pixels, so the smallest text is
``min(FONT_PT) / 72 * that`` pixels high (about 15 px, the size of the page's own text; the
first version was shown at ~6 px). The PNG is drawn at ``DPI`` = 2 x the displayed pixels,
so it stays sharp on high-density screens. tests/unit/test_docs_layout.py checks both.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "concepts" / "cycle.png"

#: Figure size in inches, the width the pages show it at, and the PNG's resolution.
FIGSIZE = (8.0, 4.6)
DISPLAY_WIDTH_PX = 800
DPI = 2 * DISPLAY_WIDTH_PX / FIGSIZE[0]
#: Font sizes in points: a stage's title, its text, the note in the middle.
FONT_PT = {"title": 15.0, "text": 11.5, "note": 11.0}

STAGES = [
    ("1. measure", "each rank times its own\ncompute per step:\nt_i(b) = α_i + β_i·b", (0.2, 0.76)),
    (
        "2. carve",
        "global batch B split into\nslices b_i minimising\nmax_i t_i(b_i), Σ b_i = B",
        (0.8, 0.76),
    ),
    (
        "3. weight",
        "gradient of rank i scaled by\nn_i / Σn, then SUM all-reduce:\nexactly the 1-device update",
        (0.8, 0.23),
    ),
    (
        "4. re-plan",
        "a new plan, versioned, takes\neffect at one agreed step\nwhen it predicts a real gain",
        (0.2, 0.23),
    ),
]


def main() -> None:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.02, 1.02)  # a margin around the boxes
    ax.set_ylim(0, 1)
    ax.axis("off")
    w, h = 0.38, 0.35
    for title, text, (x, y) in STAGES:
        box = FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.008",
            fc="#eef3fb",
            ec="#35608f",
            lw=1.5,
        )
        ax.add_patch(box)
        ax.text(
            x, y + 0.115, title, ha="center", va="center", fontsize=FONT_PT["title"], weight="bold"
        )
        ax.text(
            x, y - 0.045, text, ha="center", va="center", fontsize=FONT_PT["text"], linespacing=1.3
        )
    arrows = [
        ((0.393, 0.76), (0.607, 0.76)),
        ((0.8, 0.578), (0.8, 0.412)),
        ((0.607, 0.23), (0.393, 0.23)),
        ((0.2, 0.412), (0.2, 0.578)),
    ]
    for start, end in arrows:
        ax.add_patch(
            FancyArrowPatch(
                start, end, arrowstyle="-|>", mutation_scale=22, color="#35608f", lw=1.8
            )
        )
    ax.text(
        0.5,
        0.495,
        "every step: carve + weight\nevery window: measure,\nmaybe re-plan",
        ha="center",
        va="center",
        fontsize=FONT_PT["note"],
        style="italic",
        color="#444444",
        linespacing=1.3,
    )
    fig.savefig(OUT, metadata={"Software": None})


if __name__ == "__main__":
    main()
