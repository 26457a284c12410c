"""Atomic, cached generation of a synthetic dataset tree (shared by the generators).

Every generator of this package writes its dataset in the real on-disk layout through
:func:`generate_tree`, which gives all of them the same caching and safety rules:

* ``root/.raytrain_hetero_generated.json`` (the *marker*) records the generator's name,
  version and parameters; if it matches, the call returns at once without touching a file.
* The tree is written into a hidden temporary sibling of ``root`` and renamed into place, so
  an interrupted run never leaves a half-written ``root``. Concurrent callers with the same
  parameters are safe: the first rename wins and the others return its result.
* A marker with *different* parameters means ``root`` is ours: it is replaced.
* A non-empty ``root`` without a marker (e.g. a real downloaded dataset) is never modified:
  :class:`~raytrain_hetero.errors.DataError` is raised instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raytrain_hetero.errors import DataError

__all__ = ["MARKER_NAME", "generate_tree", "read_marker"]

logger = logging.getLogger(__name__)

MARKER_NAME = ".raytrain_hetero_generated.json"


def read_marker(root: Path) -> dict[str, Any] | None:
    """The generator marker of ``root`` as a dict, or ``None`` if absent or unreadable."""
    try:
        with open(Path(root) / MARKER_NAME) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def generate_tree(
    root: str | os.PathLike[str],
    params: Mapping[str, Any],
    write: Callable[[Path], None],
    *,
    what: str,
) -> Path:
    """Run ``write(tmp_dir)`` and atomically move the result to ``root`` (cached by marker).

    Args:
        root: Target directory.
        params: JSON-serialisable generator parameters (name, version and arguments); the
            marker holds exactly these, so any change regenerates.
        write: Writes the complete tree into the (empty, existing) directory it is given.
        what: Name of the calling generator, for messages (e.g. ``"generate_uc_merced"``).

    Returns:
        ``root`` as an absolute path.

    Raises:
        DataError: ``root`` is a file, or a non-empty directory not created by a generator.
    """
    root = Path(root).expanduser().absolute()
    params = json.loads(json.dumps(dict(params)))  # normalise (tuples -> lists) for comparison
    if root.exists():
        if not root.is_dir():
            raise DataError(f"{what}: {root} exists and is not a directory; choose another root")
        if read_marker(root) == params:
            return root
        if read_marker(root) is None and any(root.iterdir()):
            raise DataError(
                f"{what}: refusing to write into {root}: it is not empty and was not created by "
                f"a raytrain_hetero generator (no {MARKER_NAME}). If it holds the real dataset, "
                "load it directly (leave `generate` unset); otherwise choose another root."
            )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.generating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    old: Path | None = None
    try:
        tmp.mkdir()
        write(tmp)
        # The marker is written last: its presence means the tree is complete.
        (tmp / MARKER_NAME).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        try:
            os.replace(tmp, root)  # atomic; succeeds if root is absent or an empty directory
        except OSError:
            if read_marker(root) == params:  # a concurrent caller finished first
                shutil.rmtree(tmp, ignore_errors=True)
                return root
            if read_marker(root) is None:
                raise DataError(
                    f"{what}: {root} appeared and is not ours; left it untouched"
                ) from None
            old = root.parent / f".{root.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(root, old)
            os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("%s: wrote %s", what, root)
    return root
