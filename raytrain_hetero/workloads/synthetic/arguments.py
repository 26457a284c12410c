"""Argument checks shared by the synthetic-dataset generators.

Every generator validates its integer arguments, its train/val/test ``split_fractions`` and
the per-class image count of each split the same way; these helpers are that one mechanism.
Each raises :class:`~raytrain_hetero.errors.ConfigError` with a message naming the generator
(``generator``, e.g. ``"generate_eurosat"``), the argument and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError

#: Split names of the torchgeo-style generators (So2Sat's files say ``validation``).
TRAIN_VAL_TEST = ("train", "val", "test")


def check_integers(generator: str, *minimums: tuple[str, Any, int]) -> None:
    """Check that every ``(name, value, lo)`` is an integer (not a bool) with ``value >= lo``.

    Raises:
        ConfigError: The first argument that is not, naming it and its lower bound.
    """
    for name, value, lo in minimums:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise ConfigError(f"{generator}: {name} must be an integer >= {lo}, got {value!r}")


def check_split_fractions(
    generator: str, fractions: Any, split_names: Sequence[str] = TRAIN_VAL_TEST
) -> tuple[float, float, float]:
    """Return ``fractions`` as three floats, each > 0, summing to 1 (within 1e-6).

    Raises:
        ConfigError: ``fractions`` is not three positive numbers summing to 1.
    """
    try:
        fr = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        fr = ()
    if len(fr) != 3 or any(f <= 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
        raise ConfigError(
            f"{generator}: split_fractions must be 3 positive fractions "
            f"({', '.join(split_names)}) summing to 1, got {fractions!r}"
        )
    return fr  # type: ignore[return-value]


def split_counts(
    generator: str,
    samples_per_class: int,
    fractions: Sequence[float],
    split_names: Sequence[str] = TRAIN_VAL_TEST,
    *,
    at_least_one: bool = True,
) -> dict[str, int]:
    """Per-class image count of each split: ``round(fraction * samples_per_class)``.

    The validation and test counts are rounded; training gets the rest. With
    ``at_least_one`` (torchgeo-style generators) the validation and test counts are raised
    to 1 so small sets still have every class in every split; without it (So2Sat, whose
    generated counts are part of its cached marker semantics) they are plain ``round()``.

    Raises:
        ConfigError: A split would get no sample of a class; the fix is more samples.
    """
    spc = int(samples_per_class)
    n_val, n_test = (round(f * spc) for f in fractions[1:])
    if at_least_one:
        n_val, n_test = max(1, n_val), max(1, n_test)
    counts = dict(zip(split_names, (spc - n_val - n_test, n_val, n_test), strict=True))
    if min(counts.values()) < 1:
        raise ConfigError(
            f"{generator}: samples_per_class={spc} leaves a split empty with "
            f"split_fractions={tuple(fractions)} (per-class counts {counts}); every class "
            "needs a sample in every split: raise samples_per_class"
        )
    return counts


def split_members(
    seed: int, class_index: int, counts: dict[str, int], *, first: int = 0
) -> dict[str, list[int]]:
    """Which sample numbers of one class go to which split, in ``counts``' split order.

    A seeded permutation of the numbers ``first .. first + sum(counts) - 1`` (seeded by
    ``[seed, class_index, 1]``) is cut into consecutive runs of ``counts[split]``; each run is
    returned sorted. Deterministic, so a generator's file lists never change for given arguments.
    """
    perm = np.random.default_rng([seed, class_index, 1]).permutation(sum(counts.values())) + first
    members: dict[str, list[int]] = {}
    start = 0
    for split, count in counts.items():
        members[split] = sorted(perm[start : start + count].tolist())
        start += count
    return members
