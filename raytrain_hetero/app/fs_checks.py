"""Filesystem checks of a job, run on the driver before any worker starts."""

from __future__ import annotations

import logging

from raytrain_hetero.app.sections import DataConfig
from raytrain_hetero.config.fields import absolute
from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.registry import DatasetAdapter, dataset_adapter

__all__ = ["check_data_root"]

logger = logging.getLogger(__name__)


def check_data_root(cfg: DataConfig, *, adapter: DatasetAdapter | None = None) -> None:
    """Fail early, on the driver, if the data root cannot work (``adapter``: the dataset's,
    if the caller holds it; looked up otherwise).

    Raises:
        DataError: ``root`` is missing and ``generate`` is not set, or ``root`` is not a
            directory; the message names the absolute path and the fix.
    """
    root = absolute(cfg.root)
    what = (adapter if adapter is not None else dataset_adapter(cfg.dataset)).title
    if root.exists() and not root.is_dir():
        raise DataError(
            f"data.root {root} exists but is not a directory. Fix: point data.root at a "
            f"directory (a downloaded {what}, or an empty/new one with data.generate set)."
        )
    if not root.exists() and cfg.generate is None:
        raise DataError(
            f"data.root {root} does not exist and data.generate is not set. Fix: set "
            f"data.generate: {{}} to generate a synthetic {what} there, or point data.root at a "
            f"downloaded {what}."
        )
    logger.debug("data root %s: exists=%s generate=%s", root, root.exists(), cfg.generate)
