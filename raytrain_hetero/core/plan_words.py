"""A plan's slices in words: what each rank's step costs, and why a rank gets almost nothing.

Under affine cost models t_i(b) = alpha_i + beta_i * b the makespan-optimal split can rightly
give a worker the minimum slice: when its fixed cost per step alone is about as long as the
others' whole step, any sample more would lengthen every step. A bare per-sample "speed"
(1 / beta) then reads as a 92:1 ratio for workers emulated 4:1 apart; these words say instead
what the planner weighed. Pure (stdlib only).
"""

from __future__ import annotations

from collections.abc import Sequence

from raytrain_hetero.core.allocation import CostModel

__all__ = ["describe_costs", "explain_slices", "starved_ranks"]

#: A rank at the minimum slice is "held back by its fixed cost" when that cost alone reaches
#: this fraction of the other ranks' longest step.
STARVED_FIXED_SHARE = 0.5


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _per_sample(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else _ms(seconds)


def describe_costs(slices: Sequence[int], costs: Sequence[CostModel]) -> str:
    """Each rank's predicted step at its slice, fixed and per-sample costs apart, e.g.
    ``r0 86 x 45 us + 0.60 ms = 4.47 ms``."""
    return "; ".join(
        f"r{rank} {size} x {_per_sample(cost.beta)} + {_ms(cost.alpha)} = "
        f"{_ms(cost.alpha + cost.beta * size)}"
        for rank, (size, cost) in enumerate(zip(slices, costs, strict=True))
    )


def starved_ranks(
    slices: Sequence[int], costs: Sequence[CostModel], min_slice: int = 1
) -> list[tuple[int, float, float]]:
    """The ranks held at the minimum slice by their fixed cost: ``(rank, its fixed cost, the
    other ranks' longest predicted step)`` for each rank whose slice is at most ``min_slice``
    and whose fixed cost per step alone reaches :data:`STARVED_FIXED_SHARE` of that step."""
    steps = [c.alpha + c.beta * b for b, c in zip(slices, costs, strict=True)]
    found = []
    for rank, (size, cost) in enumerate(zip(slices, costs, strict=True)):
        others = [t for r, t in enumerate(steps) if r != rank]
        if size > max(min_slice, 1) or not others:
            continue
        longest = max(others)
        if longest > 0 and cost.alpha >= STARVED_FIXED_SHARE * longest:
            found.append((rank, cost.alpha, longest))
    return found


def explain_slices(slices: Sequence[int], costs: Sequence[CostModel], min_slice: int = 1) -> str:
    """:func:`describe_costs`, then one sentence per rank :func:`starved_ranks` finds."""
    words = [describe_costs(slices, costs)]
    for rank, fixed, longest in starved_ranks(slices, costs, min_slice):
        words.append(
            f"r{rank} gets {slices[rank]}: its fixed cost per step alone ({_ms(fixed)}) is "
            f"{fixed / longest:.0%} of the others' whole step ({_ms(longest)}), so every "
            "sample more would lengthen every step"
        )
    return ". ".join(words)
