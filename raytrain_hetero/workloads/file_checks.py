"""Bad input files: name them, then skip them or fail clearly (``on_bad_file``).

A corrupt or truncated TIFF / ``.mat`` must never crash a worker with a bare decoder error
or, worse, silently. Two tools:

* :class:`CheckedLoader` wraps a path loader (PIL, rasterio, ...) so that any decoding error
  -- or, when the dataset fixes it, a wrong band count -- becomes a
  :class:`~raytrain_hetero.errors.DataError` naming the file, what was expected and found,
  and the fix. It is cheap (no extra reads), so every loader of this package uses it.
* :func:`find_unreadable_files` decodes files up front (on the driver, before training) and
  returns the bad ones; :func:`apply_bad_file_policy` then raises one error listing them
  (``"error"``) or drops them from an ImageFolder-style dataset (``"skip"``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from raytrain_hetero.errors import DataError

logger = logging.getLogger(__name__)

BadFilePolicy = Literal["error", "skip"]
BAD_FILE_POLICIES: tuple[str, ...] = ("error", "skip")
#: ``on_bad_file`` value that turns the up-front check off (files then fail when read).
CHECK_OFF = "off"


def unreadable_message(path: str | os.PathLike[str], exc: BaseException, what: str = "file") -> str:
    """``"<path>: cannot read <what> (<Error>: <detail>) ... Fix: ..."``."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
    return (
        f"{os.fspath(path)}: cannot read {what} ({type(exc).__name__}: {detail}); the file is "
        "corrupt, truncated or not in the expected format. Fix: replace it with a good copy "
        "(re-download or regenerate), or set data.on_bad_file: skip to leave it out."
    )


class CheckedLoader:
    """Wraps ``loader(path)`` so that a failure raises a DataError naming ``path``.

    Picklable (DataLoader worker processes, Ray workers) as long as ``loader`` is.

    Args:
        loader: The wrapped function, e.g. torchvision's ``pil_loader`` or torchgeo's
            ``rasterio_loader``.
        what: What the file holds, for messages (``"image"``).
        bands: Bands every file must have (the last axis of the decoded array, channels
            last as torchgeo's loaders return it); ``None``: not checked.
    """

    def __init__(
        self, loader: Callable[[str], Any], what: str = "image", bands: int | None = None
    ) -> None:
        self.loader = loader
        self.what = what
        self.bands = bands

    def __call__(self, path: str) -> Any:
        try:
            result = self.loader(path)
            if hasattr(result, "load"):  # PIL decodes lazily: force it here, inside the guard
                result.load()
        except DataError:
            raise
        except Exception as exc:  # any decoder error means an unreadable file
            raise DataError(unreadable_message(path, exc, self.what)) from exc
        if self.bands is not None:
            shape = getattr(result, "shape", ())
            found = int(shape[-1]) if len(shape) == 3 else 1
            if found != self.bands:
                raise DataError(
                    f"{os.fspath(path)}: {self.what} has {found} band(s), expected {self.bands}; "
                    "the file is not from this dataset or was written wrongly. Fix: replace it "
                    "with a good copy (re-download or regenerate), or set data.on_bad_file: skip "
                    "to leave it out."
                )
        return result

    def __repr__(self) -> str:
        return f"CheckedLoader({getattr(self.loader, '__name__', self.loader)!r})"


def find_unreadable_files(
    paths: Iterable[str | os.PathLike[str]],
    read: Callable[[str], Any],
    *,
    threads: int = 4,
) -> list[tuple[str, str]]:
    """Fully decode every file with ``read``; return ``[(path, message)]`` of those that fail.

    Decoding (not just opening) is what catches truncated files: TIFF headers stay valid
    when the strips at the end are missing. Files are read by a few threads (the decoders
    release the GIL), in a deterministic result order.
    """
    path_list = [os.fspath(p) for p in paths]
    checked = CheckedLoader(read, "file")

    def check(path: str) -> tuple[str, str] | None:
        try:
            checked(path)
        except DataError as exc:  # names the file: reported, not swallowed
            return path, str(exc)
        return None

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(check, path_list))
    return [r for r in results if r is not None]


def drop_samples(dataset: Any, bad_paths: Iterable[str]) -> int:
    """Remove the samples whose file is in ``bad_paths`` from an ImageFolder-style dataset.

    Keeps ``samples``, ``imgs`` and ``targets`` consistent (torchvision's DatasetFolder /
    torchgeo's NonGeoClassificationDataset); class numbering is unchanged. Returns the number
    of samples removed.
    """
    bad = {os.path.abspath(p) for p in bad_paths}
    if not bad:
        return 0
    kept = [s for s in dataset.samples if os.path.abspath(s[0]) not in bad]
    removed = len(dataset.samples) - len(kept)
    dataset.samples = kept
    if hasattr(dataset, "imgs"):
        dataset.imgs = kept
    if hasattr(dataset, "targets"):
        dataset.targets = [label for _, label in kept]
    return removed


def apply_bad_file_policy(
    bad: Sequence[tuple[str, str]],
    policy: BadFilePolicy,
    *,
    dataset_name: str,
) -> list[str]:
    """Act on the result of :func:`find_unreadable_files`.

    Returns:
        The paths to leave out (empty when nothing is bad).

    Raises:
        DataError: ``policy == "error"`` and some file is bad; the message lists every bad
            file (up to 20) with its decoder error and the fix.
    """
    if policy not in BAD_FILE_POLICIES:
        raise DataError(f"on_bad_file must be one of {list(BAD_FILE_POLICIES)}, got {policy!r}")
    if not bad:
        return []
    if policy == "error":
        shown = "\n  ".join(message for _, message in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise DataError(f"{dataset_name}: {len(bad)} unreadable file(s):\n  {shown}{more}")
    for _path, message in bad:
        logger.warning("skipping unreadable file: %s", message)
    logger.warning("%s: skipped %d unreadable file(s)", dataset_name, len(bad))
    return [path for path, _ in bad]
