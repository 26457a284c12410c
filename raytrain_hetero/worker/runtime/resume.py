"""A worker's side of checkpoints: write the run's state, resume the cursor, restore generators.

Called by :mod:`raytrain_hetero.worker.api` (``report(checkpoint=...)`` and
``prepare_data_loader``); the state's format is :mod:`raytrain_hetero.worker.state.checkpoint_state`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ray

from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.runtime.registry import WorkerRuntime
from raytrain_hetero.worker.state.checkpoint_state import (
    CheckpointState,
    require_state,
    write_state,
)
from raytrain_hetero.worker.state.rng_state import RngState, restore_rng

logger = logging.getLogger(__name__)

__all__ = ["apply_pending_rng", "restore_from_checkpoint", "write_checkpoint_state"]


def write_checkpoint_state(runtime: WorkerRuntime, directory: Path, rng: list[RngState]) -> Path:
    """Write this run's carving, cursor, plans, slot costs and generators into ``directory``."""
    if runtime.loader is None:
        raise HeteroError("report(checkpoint=...) before prepare_data_loader: nothing to resume.")
    state = CheckpointState.capture(
        runtime.loader.carver,
        runtime.loader.cursor,
        runtime.identity.world_size,
        runtime.plans.history,
        runtime.plans.rank_slots,
        rng,
    )
    return write_state(directory, state)


def restore_from_checkpoint(runtime: WorkerRuntime, carver: EpochCarver) -> Cursor:
    """The cursor to start from; adopts the checkpoint's plan history and slot costs."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return Cursor(0, 0)
    with checkpoint.as_directory() as directory:
        state = require_state(Path(directory), checkpoint.path)
    # The group size first: a different one changes min_step_size too, less clearly named.
    state.check_group_size(runtime.identity.setup.batch.slice_quantum)
    state.check_carving(carver)
    runtime.plans.restore(state.plans, state.slot_costs())
    rank, world = runtime.identity.rank, runtime.identity.world_size
    if state.rng is not None and len(state.rng) == world:
        runtime.pending_rng = state.rng[rank]
    else:
        logger.info(
            "checkpoint carries no generator state for a world of %d ranks (it has %s): "
            "data order resumes exactly, random draws (Dropout) restart",
            world,
            "none" if state.rng is None else len(state.rng),
        )
    logger.info(
        "resuming at epoch %d step %d (global step %d)",
        state.cursor.epoch,
        state.cursor.step_in_epoch,
        state.global_step,
    )
    return state.cursor


def apply_pending_rng(runtime: WorkerRuntime) -> None:
    """Restore the checkpoint's generators right before the first resumed batch.

    Later than building the model, optimizer and first plan (which draw from them too),
    so the draws from here on are exactly the uninterrupted run's.
    """
    if runtime.pending_rng is not None:
        restore_rng(runtime.pending_rng, runtime.identity.device)
        runtime.pending_rng = None
