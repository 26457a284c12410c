"""Per-band normalisation statistics computed from the training split, cached on disk.

Statistics come from the *training* split only (validation/test pixels must not leak into
preprocessing) and are accumulated in float64 with Chan et al.'s pairwise merge, so they are
exact to rounding however the data is chunked. Computing them means reading the training data
once; :func:`cached_band_stats` stores the result as JSON keyed by a digest of everything it
depends on (file identities: path, size, modification time; split parameters), so later runs,
and every Ray worker of a run, read the small JSON instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.atomic import atomic_write_json

logger = logging.getLogger(__name__)

_STATS_FORMAT = 1


@dataclass(frozen=True)
class BandStats:
    """Per-band mean and standard deviation (population) over ``count`` pixels.

    Attributes:
        mean: One value per band.
        std: One value per band (floored at a tiny epsilon by :class:`Standardize`).
        count: Pixels per band the statistics were computed from.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    count: int


class BandStatsAccumulator:
    """Streaming per-band mean/variance: feed arrays whose axis ``band_axis`` is the band."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def update(self, array: Any, band_axis: int = 0) -> None:
        """Add every pixel of ``array`` (numpy or torch, any shape with a band axis)."""
        values = np.asarray(array, dtype=np.float64)
        values = np.moveaxis(values, band_axis, -1).reshape(-1, values.shape[band_axis])
        n = values.shape[0]
        if n == 0:
            return
        mean = values.mean(axis=0)
        m2 = ((values - mean) ** 2).sum(axis=0)
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = n, mean, m2
            return
        if mean.shape != self.mean.shape:
            raise ValueError(f"band count changed: {self.mean.shape[0]} then {mean.shape[0]}")
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    def result(self) -> BandStats:
        """The statistics so far (raises if nothing was added)."""
        if self.mean is None or self.m2 is None or self.count == 0:
            raise ValueError("no pixels were added")
        std = np.sqrt(self.m2 / self.count)
        return BandStats(tuple(self.mean.tolist()), tuple(std.tolist()), self.count)


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{path, size, mtime_ns}`` of a file: changes when the file is replaced or edited."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def key_digest(key: Mapping[str, Any]) -> str:
    """A short digest of a JSON-able cache key (names the cached file or directory)."""
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def normalised_key(key: Mapping[str, Any]) -> Any:
    """``key`` as it reads back from JSON (compared with a cached copy's stored key)."""
    return json.loads(json.dumps(dict(key), sort_keys=True, default=str))


def cached_json(
    key: Mapping[str, Any],
    compute: Callable[[], Any],
    cache_dir: str | os.PathLike[str] | None,
    *,
    prefix: str,
) -> Any:
    """Return the JSON value cached under ``key`` in ``cache_dir``, computing it once.

    The file is ``<cache_dir>/<prefix>-<digest of key>.json``, written atomically and
    checked against the full key when read. ``cache_dir=None`` disables the cache; an
    unwritable directory only disables writing (logged), never fails.
    """
    if cache_dir is None:
        return compute()
    directory = Path(cache_dir)
    path = directory / f"{prefix}-{key_digest(key)}.json"
    normal_key = normalised_key(key)
    try:
        data = json.loads(path.read_text())
        if data.get("format") == _STATS_FORMAT and data.get("key") == normal_key:
            logger.debug("%s from cache %s", prefix, path)
            return data["value"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    value = compute()
    try:
        atomic_write_json(
            path, {"format": _STATS_FORMAT, "key": normal_key, "value": value}, indent=None
        )
        logger.info("cached %s in %s", prefix, path)
    except OSError as exc:
        logger.info("%s not cached (%s is not writable: %s)", prefix, directory, exc)
    return value


def cached_band_stats(
    key: Mapping[str, Any],
    images: Iterable[Any],
    cache_dir: str | os.PathLike[str] | None,
    *,
    band_axis: int = 0,
) -> BandStats:
    """Band statistics of ``images`` (iterated only on a cache miss), cached under ``key``.

    Args:
        key: JSON-serialisable description of everything the statistics depend on.
        images: Arrays whose axis ``band_axis`` is the band (e.g. a lazy generator).
        cache_dir: Directory of ``band_stats-<digest>.json`` files (see :func:`cached_json`);
            ``None`` disables the cache.
    """

    def compute() -> dict[str, Any]:
        acc = BandStatsAccumulator()
        for image in images:
            acc.update(image, band_axis=band_axis)
        return asdict(acc.result())

    value = cached_json(key, compute, cache_dir, prefix="band_stats")
    return BandStats(tuple(value["mean"]), tuple(value["std"]), int(value["count"]))


class Standardize:
    """torchgeo-style sample transform: ``sample[key] <- (x - mean[b]) / std[b]`` per band.

    Picklable (DataLoader workers, Ray). Bands whose std is ~0 are only centred.

    Args:
        stats: Per-band statistics (band count must match the images); ``None``: only
            convert to float32 (and resize).
        key: The sample entry to transform.
        resize_to: Optional square side to resize ``key`` to after standardising (bilinear,
            antialiased), e.g. to train on smaller images than the dataset's own size.
    """

    def __init__(
        self, stats: BandStats | None, key: str = "image", resize_to: int | None = None
    ) -> None:
        import torch

        self.stats = stats
        self.key = key
        self.resize_to = resize_to
        bands = stats or BandStats(mean=(0.0,), std=(1.0,), count=0)  # identity, broadcast
        self.mean = torch.tensor(bands.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(bands.std, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.where(std > 1e-12, std, torch.ones_like(std))

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = dict(sample)
        x = (sample[self.key].float() - self.mean) / self.std
        if self.resize_to is not None and tuple(x.shape[-2:]) != (self.resize_to,) * 2:
            import torch.nn.functional as F

            x = F.interpolate(
                x[None],
                size=(self.resize_to, self.resize_to),
                mode="bilinear",
                antialias=True,
                align_corners=False,
            )[0]
        out[self.key] = x
        return out

    def __repr__(self) -> str:
        return (
            f"Standardize(bands={self.stats and len(self.stats.mean)}, key={self.key!r}, "
            f"resize_to={self.resize_to})"
        )


def files_band_stats(
    kind: str,
    files: Sequence[str | os.PathLike[str]],
    images: Iterable[Any],
    cache_dir: str | os.PathLike[str] | None,
) -> BandStats:
    """:func:`cached_band_stats` of ``images`` under a key made of ``kind`` and the identities
    (path, size, mtime) of the ``files`` they come from."""
    key = {"kind": kind, "files": [file_identity(f) for f in files]}
    return cached_band_stats(key, images, cache_dir)
