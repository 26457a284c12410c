"""Atomic, cached generation of a synthetic dataset tree (shared by the generators).

Every generator of this package writes its dataset in the real on-disk layout through
:func:`generate_tree`, which gives all of them the same caching and safety rules:

* ``root/.raytrain_hetero_generated.json`` (the *marker*) records the generator's name,
  version and parameters; if it matches, the call returns at once without touching a file.
* Versioned: every parameter set is written once, complete, to its own directory
  ``<parent>/.<name>.versions/<digest of the parameters>/`` (through a hidden temporary
  sibling renamed into place, so an interrupted run never leaves a half-written version),
  and ``root`` is a symbolic link to the current version, switched atomically
  (``os.replace`` of a new link). A reader that opened ``root`` earlier keeps reading the
  version it resolved (:func:`resolve_version` -- the dataset loaders resolve the link once
  when they open the root), because no version directory is ever modified or deleted by
  the generators: regenerating with other parameters adds a version and moves the pointer.
  Old versions stay until removed by hand (``rm -r <parent>/.<name>.versions/<digest>``).
  Concurrent callers with the same parameters are safe: the first rename wins.
* A marker with *different* parameters means ``root`` is ours: the pointer moves to the new
  version. A non-empty directory ``root`` (e.g. a real downloaded dataset), or a link to a
  tree no generator wrote, is never modified: :class:`~raytrain_hetero.errors.DataError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raytrain_hetero.errors import DataError

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


def resolve_version(root: str | os.PathLike[str]) -> Path:
    """The directory ``root`` stands for now (a generated root's current version; any other
    path as it is, symbolic links resolved). Open datasets through this, once, so that a
    regeneration during a run does not change the files under the open dataset."""
    return Path(root).expanduser().resolve()


def _digest(params: Mapping[str, Any]) -> str:
    text = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _point(root: Path, version: Path) -> None:
    """Make ``root`` a symbolic link to ``version`` in one atomic step."""
    link = root.parent / f".{root.name}.link-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.symlink(os.path.relpath(version, root.parent), link, target_is_directory=True)
    try:
        os.replace(link, root)
    except BaseException:
        link.unlink(missing_ok=True)
        raise


def _write_version(
    root: Path, params: dict[str, Any], write: Callable[[Path], None], what: str
) -> Path:
    """The complete version directory of ``params`` (written now unless it exists)."""
    store = root.parent / f".{root.name}.versions"
    version = store / _digest(params)
    if read_marker(version) == params:
        return version
    tmp = root.parent / f".{root.name}.generating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write(tmp)
        # The marker is written last: its presence means the tree is complete.
        (tmp / MARKER_NAME).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        store.mkdir(exist_ok=True)
        try:
            os.replace(tmp, version)  # atomic; fails if a concurrent caller got there first
        except OSError:
            if read_marker(version) != params:
                raise DataError(
                    f"{what}: {version} exists and is not a complete version; remove it"
                ) from None
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("%s: wrote %s", what, version)
    return version


def generate_tree(
    root: str | os.PathLike[str],
    params: Mapping[str, Any],
    write: Callable[[Path], None],
    *,
    what: str,
) -> Path:
    """Run ``write(tmp_dir)`` into a new version of ``root`` and point ``root`` at it (cached).

    Args:
        root: Target path (becomes a symbolic link to the current version).
        params: JSON-serialisable generator parameters (name, version and arguments); the
            marker holds exactly these, so any change adds a version.
        write: Writes the complete tree into the (empty, existing) directory it is given.
        what: Name of the calling generator, for messages (e.g. ``"generate_uc_merced"``).

    Returns:
        ``root`` as an absolute path.

    Raises:
        DataError: ``root`` is a file, or a non-empty directory not created by a generator.
    """
    root = Path(root).expanduser().absolute()
    params = json.loads(json.dumps(dict(params)))  # normalise (tuples -> lists) for comparison
    if root.is_symlink() and read_marker(root) == params:
        return root
    if root.exists() and not root.is_symlink():
        if not root.is_dir():
            raise DataError(f"{what}: {root} exists and is not a directory; choose another root")
        if any(root.iterdir()):
            raise DataError(
                f"{what}: refusing to write into {root}: it is not empty and was not created by "
                "a raytrain_hetero generator (a generated root links to a version directory). If "
                "it holds the real dataset, load it directly (leave `generate` unset); otherwise "
                "choose another root."
            )
        root.rmdir()
    elif root.is_symlink() and read_marker(root) is None and root.exists():
        raise DataError(
            f"{what}: refusing to repoint {root}: it links to {os.readlink(root)}, which was "
            "not created by a raytrain_hetero generator; choose another root."
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    version = _write_version(root, params, write, what)
    _point(root, version)
    logger.info("%s: %s -> %s", what, root, version)
    return root
