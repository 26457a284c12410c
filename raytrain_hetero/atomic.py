"""The one atomic-write mechanism: readers see the old file or the new one, never a torn one.

Every file raytrain_hetero writes for others to read (outputs, checkpoint state, caches,
generated datasets' marker files, benchmark results) goes through :func:`atomic_write`: the
content is written to a temporary file in the destination directory, flushed and fsynced, then
moved over the target with :func:`os.replace` (atomic on POSIX within one filesystem). Standard
library only, so every layer may use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "move_into_place",
]


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[IO[Any]], None], *, binary: bool = False
) -> Path:
    """Call ``write(fh)`` on a temporary file next to ``path`` (parents created; text mode is
    UTF-8 with ``newline=""``), then move it over ``path``; returns ``path``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if binary:
            fh: IO[Any] = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
        with fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda fh: fh.write(text))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda fh: fh.write(data), binary=True)


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON (``allow_nan=False``: NaN is not JSON) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(data, indent=indent, allow_nan=False) + "\n")


def move_into_place(staged: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Publish a finished file or directory written elsewhere on the same filesystem (e.g. by
    Ray Data's Parquet writer, which writes only to a path of its own) under ``path`` with one
    :func:`os.replace`: readers see the old ``path`` or the complete new one. A directory ``path``
    must be absent or empty (nothing is deleted here).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, target)
    return target
