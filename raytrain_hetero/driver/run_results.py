"""What a run leaves: the Result's metrics, and the checkpoints kept on disk.

**Metrics.** Ray Train V2 builds ``Result.metrics`` from the last report *with a checkpoint*:
a loop that reports metrics alone (the docs' examples) gets ``None``, and one that checkpoints
every few epochs gets stale figures. Ray's own ``Result`` docstring promises "the latest set
of metrics reported by the training function", so ``HeteroTrainer.fit()`` keeps that promise:
:class:`LastReportKeeper` (a Ray Train callback, run in the Train controller) leaves rank 0's
metrics of every report under one key of Ray's internal KV, overwritten each time (no actor,
nothing that grows), and :func:`carry_last_report` puts the last one into the Result.
``Result.checkpoint`` stays the latest checkpoint, which may be older than the metrics.

**Checkpoints.** Ray keeps every checkpoint unless ``CheckpointConfig.num_to_keep`` says
otherwise: each epoch's full copy (five ResNet-18 + AdamW copies of torchgeo's how-to, 643
MB). Resume needs the latest one only: it holds the model, the optimizer, the sampler cursor
(epoch and offset), the plan history and every rank's generator states. So
:func:`with_checkpoint_retention` keeps :data:`DEFAULT_CHECKPOINTS_TO_KEEP` when the
RunConfig leaves ``num_to_keep`` unset; ``CheckpointConfig(num_to_keep=N)`` keeps more.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from typing import Any

from ray.train import CheckpointConfig, Result, RunConfig, UserCallback

from raytrain_hetero.driver._ray_compat import put_run_value, take_run_value

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CHECKPOINTS_TO_KEEP",
    "LastReportKeeper",
    "carry_last_report",
    "with_checkpoint_retention",
]

#: Checkpoints kept when the RunConfig does not say: the latest, all that resume reads.
DEFAULT_CHECKPOINTS_TO_KEEP = 1


def with_checkpoint_retention(run_config: RunConfig) -> RunConfig:
    """``run_config`` keeping :data:`DEFAULT_CHECKPOINTS_TO_KEEP` checkpoints if its
    ``checkpoint_config.num_to_keep`` is unset (Ray's default keeps all); else unchanged."""
    checkpoints = run_config.checkpoint_config or CheckpointConfig()
    if checkpoints.num_to_keep is not None:
        return run_config
    logger.debug(
        "checkpoints: keeping the latest %d (what resume needs); "
        "RunConfig(checkpoint_config=CheckpointConfig(num_to_keep=N)) keeps more",
        DEFAULT_CHECKPOINTS_TO_KEEP,
    )
    kept = dataclasses.replace(checkpoints, num_to_keep=DEFAULT_CHECKPOINTS_TO_KEEP)
    return dataclasses.replace(run_config, checkpoint_config=kept)


def _key(run_id: str) -> str:
    return f"last_report/{run_id}"


class LastReportKeeper(UserCallback):
    """Ray Train callback (runs in the Train controller): after every ``ray.train.report``,
    leaves rank 0's metrics for the driver of run ``run_id`` (one key, overwritten).

    Args:
        run_id: The HeteroTrainer run whose driver reads them (:func:`carry_last_report`).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        if not metrics:
            return
        try:
            put_run_value(_key(self.run_id), pickle.dumps(dict(metrics[0])))
        except Exception as exc:  # noqa: BLE001 - the Result then has Ray's own metrics
            logger.warning("the last report's metrics were not kept for the Result: %s", exc)


def carry_last_report(result: Result | None, run_id: str) -> Result | None:
    """``result`` whose ``metrics`` are run ``run_id``'s last report (rank 0's), checkpoint
    or not; the kept report is removed either way (call it once per run, ``result`` None to
    only clean up). Without a kept report, Ray's metrics stay."""
    try:
        raw = take_run_value(_key(run_id))
        last = pickle.loads(raw) if raw is not None else None
    except Exception as exc:  # noqa: BLE001 - Ray's own metrics then stay
        logger.warning("the last report's metrics could not be read back: %s", exc)
        last = None
    if result is not None and last is not None:
        result.metrics = last
    return result
