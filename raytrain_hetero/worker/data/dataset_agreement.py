"""Every rank must carve the same dataset: compare (length, file-list hash) across ranks.

The carving indexes by position, so differing node-local copies would silently train on other
samples than planned, or hang. :func:`dataset_fingerprint` is a dataset's length and, where it
lists its files (``files``, ``samples``, ``imgs``, through ``Subset``-style wrappers), a hash
of that list relative to its root; :func:`check_agreement` names the ranks and nodes that
differ from the majority.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raytrain_hetero.errors import DataError

__all__ = ["DatasetFingerprint", "RankDataset", "check_agreement", "dataset_fingerprint"]

_FILE_LIST_ATTRIBUTES = ("files", "samples", "imgs")
_MAX_WRAPPERS = 8


@dataclass(frozen=True)
class DatasetFingerprint:
    """What identifies a dataset across nodes.

    Attributes:
        length: ``len(dataset)``.
        files_hash: Hash of the file list (paths relative to the root), or None if the
            dataset lists no files.
        files_attribute: Where the file list came from (e.g. ``"dataset.samples"``).
    """

    length: int
    files_hash: str | None = None
    files_attribute: str | None = None


@dataclass(frozen=True)
class RankDataset:
    """One rank's fingerprint and where that rank runs.

    Attributes:
        node: Node id and host name of the rank.
        fingerprint: Its dataset's fingerprint.
    """

    rank: int
    node: str
    fingerprint: DatasetFingerprint


def _relative(entry: Any, root: str | None) -> str:
    if isinstance(entry, (tuple, list)):
        return "|".join(_relative(e, root) for e in entry)
    text = os.fspath(entry) if isinstance(entry, os.PathLike) else str(entry)
    if root and os.path.isabs(text):
        try:
            return os.path.relpath(text, root)
        except ValueError:  # another drive (Windows)
            return text
    return text


def _file_list_hash(dataset: Any) -> tuple[str, str] | None:
    digest = hashlib.sha256()
    path = []
    current = dataset
    for _ in range(_MAX_WRAPPERS):
        root = getattr(current, "root", None)
        root = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
        for name in _FILE_LIST_ATTRIBUTES:
            entries = getattr(current, name, None)
            if isinstance(entries, (list, tuple)):
                for entry in entries:
                    digest.update(_relative(entry, root).encode())
                    digest.update(b"\n")
                return digest.hexdigest()[:16], ".".join([*path, name])
        inner = getattr(current, "dataset", None)
        if inner is None or inner is current:
            return None
        indices = getattr(current, "indices", None)
        if indices is not None:
            digest.update(repr([int(i) for i in indices]).encode())
        path.append("dataset")
        current = inner
    return None


def dataset_fingerprint(dataset: Any, length: int) -> DatasetFingerprint:
    """The fingerprint of ``dataset`` whose ``len()`` is ``length``."""
    found = _file_list_hash(dataset)
    if found is None:
        return DatasetFingerprint(length)
    return DatasetFingerprint(length, found[0], found[1])


def check_agreement(ranks: Sequence[RankDataset]) -> None:
    """Raise unless every rank has the same fingerprint.

    Raises:
        DataError: Naming the ranks (and their nodes) that differ from the majority, what
            they see and what the others see.
    """
    if len({r.fingerprint for r in ranks}) <= 1:
        return
    counts = Counter(r.fingerprint for r in ranks)
    majority = max(
        counts, key=lambda f: (counts[f], -min(r.rank for r in ranks if r.fingerprint == f))
    )

    def describe(fingerprint: DatasetFingerprint) -> str:
        text = f"{fingerprint.length} samples"
        if fingerprint.files_hash is not None:
            text += f", file list {fingerprint.files_hash} ({fingerprint.files_attribute})"
        return text

    differing = [r for r in ranks if r.fingerprint != majority]
    agreeing = [r.rank for r in ranks if r.fingerprint == majority]
    details = "; ".join(
        f"rank {r.rank} on node {r.node} sees {describe(r.fingerprint)}" for r in differing
    )
    raise DataError(
        f"Ranks see different datasets: {details}; rank(s) {agreeing} see "
        f"{describe(majority)}. The carving indexes samples by position, so every rank must "
        "load the same files in the same order. Fix: make the dataset identical on every node "
        "(same files under the data root; with on_bad_file: skip, remove the bad files "
        "everywhere), or use shared storage."
    )
