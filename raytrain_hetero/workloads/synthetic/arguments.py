"""Argument checks and file-tree steps shared by the synthetic-dataset generators.

Every generator validates its integer arguments, its train/val/test ``split_fractions`` and
the per-class image count of each split the same way, draws its classes in seeded chunks,
lists split members in split files and writes georeferenced GeoTIFFs; these helpers are that
one mechanism. The checks raise :class:`~raytrain_hetero.errors.ConfigError` with a message
naming the generator (``generator``, e.g. ``"generate_eurosat"``), the argument and the fix.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError


def check_integers(generator: str, *minimums: tuple[str, Any, int]) -> None:
    """Check that every ``(name, value, lo)`` is an integer (not a bool) with ``value >= lo``.

    Raises:
        ConfigError: The first argument that is not, naming it and its lower bound.
    """
    for name, value, lo in minimums:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise ConfigError(f"{generator}: {name} must be an integer >= {lo}, got {value!r}")


def check_split_fractions(generator: str, fractions: Any) -> tuple[float, float, float]:
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
            f"{generator}: split_fractions must be 3 positive fractions (train, val, test) "
            f"summing to 1, got {fractions!r}"
        )
    return fr  # type: ignore[return-value]


def split_counts(
    generator: str, samples_per_class: int, fractions: Sequence[float]
) -> dict[str, int]:
    """Per-class image count of each split: validation and test get
    ``max(1, round(fraction * samples_per_class))`` (every class in every split, as torchgeo
    requires), training the rest.

    Raises:
        ConfigError: Training would get no sample of a class; the fix is more samples.
    """
    spc = int(samples_per_class)
    n_val, n_test = (max(1, round(f * spc)) for f in fractions[1:])
    counts = {"train": spc - n_val - n_test, "val": n_val, "test": n_test}
    if counts["train"] < 1:
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


def class_chunks(
    seed: int, classes: Sequence[str], samples_per_class: int, chunk: int
) -> Iterator[tuple[int, str, int, int, np.random.Generator]]:
    """``(class index, class, first sample, count, rng)`` for every chunk of every class.

    Each chunk has its own generator seeded ``[seed, class index, 0, chunk index]``, so the
    images are deterministic and independent of how many chunks precede them.
    """
    for ci, cls in enumerate(classes):
        for start in range(0, samples_per_class, chunk):
            rng = np.random.default_rng([seed, ci, 0, start // chunk])
            yield ci, cls, start, min(chunk, samples_per_class - start), rng


def write_split_lists(
    root: Path,
    split_file: str,
    seed: int,
    classes: Sequence[str],
    counts: dict[str, int],
    entry: Callable[[str, int], str],
    *,
    first: int = 0,
) -> None:
    """Write ``root/split_file.format(split=...)`` per split: one ``entry(class, number)`` per
    line, the numbers chosen per class by :func:`split_members`."""
    lines: dict[str, list[str]] = {split: [] for split in counts}
    for ci, cls in enumerate(classes):
        for split, members in split_members(seed, ci, counts, first=first).items():
            lines[split].extend(entry(cls, k) for k in members)
    for split, names in lines.items():
        (root / split_file.format(split=split)).write_text("\n".join(names) + "\n")


def write_geotiff(
    path: str | os.PathLike[str],
    array: np.ndarray,
    *,
    epsg: int,
    origin: tuple[float, float],
    pixel: float,
    descriptions: Sequence[str] | None = None,
) -> None:
    """Write ``(bands, H, W)`` ``array`` as a GeoTIFF with north-up ``pixel``-metre pixels whose
    top-left corner is ``origin`` (easting, northing) in ``EPSG:epsg``."""
    import rasterio
    from affine import Affine

    bands, height, width = array.shape
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        dtype=array.dtype.name,
        count=bands,
        height=height,
        width=width,
        crs=_crs(epsg),
        transform=Affine(pixel, 0.0, float(origin[0]), 0.0, -pixel, float(origin[1])),
    ) as dst:
        dst.write(array)
        if descriptions is not None:
            dst.descriptions = tuple(descriptions)


@functools.cache
def _crs(epsg: int) -> Any:
    from rasterio.crs import CRS

    return CRS.from_epsg(epsg)  # parsed once per zone: thousands of small files share a few
