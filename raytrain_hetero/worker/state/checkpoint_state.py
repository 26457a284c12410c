"""The versioned resume state a worker writes into every checkpoint.

``raytrain_hetero_state.json`` carries the carving cursor and the carving parameters it is
valid for, the plan history, each rank's worker slot (to reuse measured cost models) and,
since format 2, every rank's random-generator state (same Dropout masks after a resume).
Written atomically; reading checks the format version and still reads format 1.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.atomic import atomic_write_json
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.state.rng_state import RngState

logger = logging.getLogger(__name__)

__all__ = [
    "STATE_FILE",
    "STATE_FORMAT",
    "CheckpointState",
    "read_state",
    "require_state",
    "slot_costs",
    "write_state",
]

STATE_FILE = "raytrain_hetero_state.json"
STATE_FORMAT = 2
#: Formats this release reads (1: before per-rank RNG state).
READABLE_FORMATS = (1, 2)
_CARVING_KEYS = ("dataset_size", "global_batch_size", "seed", "min_step_size")


@dataclass(frozen=True)
class CheckpointState:
    """What a worker group needs to resume exactly.

    ``cursor`` (the next step) is valid only for the carving of ``dataset_size``,
    ``global_batch_size``, ``seed`` and ``min_step_size``, which must match on resume.
    ``world_size``, ``rank_slots`` and ``rng`` (None: format 1) are the writing group's.
    """

    cursor: Cursor
    global_step: int
    dataset_size: int
    global_batch_size: int
    seed: int
    min_step_size: int
    world_size: int
    plans: tuple[Plan, ...]
    rank_slots: tuple[int, ...] | None
    rng: tuple[RngState, ...] | None = None

    @classmethod
    def capture(
        cls,
        carver: EpochCarver,
        cursor: Cursor,
        world_size: int,
        plans: Sequence[Plan],
        rank_slots: Sequence[int] | None,
        rng: Sequence[RngState] | None = None,
    ) -> CheckpointState:
        """The state of a worker now (``rng``: every rank's generators, by rank)."""
        return cls(
            cursor=cursor,
            global_step=carver.global_step(cursor),
            dataset_size=carver.dataset_size,
            global_batch_size=carver.global_batch_size,
            seed=carver.seed,
            min_step_size=carver.min_step_size,
            world_size=world_size,
            plans=tuple(plans),
            rank_slots=tuple(rank_slots) if rank_slots is not None else None,
            rng=tuple(rng) if rng is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form, tagged with the format version."""
        return {
            "format": STATE_FORMAT,
            "cursor": {"epoch": self.cursor.epoch, "step_in_epoch": self.cursor.step_in_epoch},
            "global_step": self.global_step,
            "dataset_size": self.dataset_size,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "min_step_size": self.min_step_size,
            "world_size": self.world_size,
            "plans": [p.to_dict() for p in self.plans],
            # Which slot each rank filled: lets a restarted group reuse their cost models.
            "rank_slots": list(self.rank_slots) if self.rank_slots is not None else None,
            "rng": [r.to_dict() for r in self.rng] if self.rng is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "checkpoint state") -> CheckpointState:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: For a format version this release does not know.
        """
        version = data.get("format")
        if version not in READABLE_FORMATS:
            raise ConfigError(
                f"{source} has format version {version!r}; this raytrain_hetero reads versions "
                f"{', '.join(map(str, READABLE_FORMATS))}. Resume with the release that wrote it, or start a new run "
                "(new RunConfig name)."
            )
        slots = data.get("rank_slots")
        rng = data.get("rng")
        return cls(
            cursor=Cursor(int(data["cursor"]["epoch"]), int(data["cursor"]["step_in_epoch"])),
            global_step=int(data["global_step"]),
            dataset_size=int(data["dataset_size"]),
            global_batch_size=int(data["global_batch_size"]),
            seed=int(data["seed"]),
            min_step_size=int(data["min_step_size"]),
            world_size=int(data["world_size"]),
            plans=tuple(Plan.from_dict(p) for p in data.get("plans", [])),
            rank_slots=tuple(int(s) for s in slots) if slots else None,
            rng=tuple(RngState.from_dict(r) for r in rng) if rng else None,
        )

    def check_carving(self, carver: EpochCarver) -> None:
        """Refuse to resume under a different carving (the cursor would mean other samples).

        Raises:
            ConfigError: Naming every mismatched parameter.
        """
        mismatched = {
            key: (getattr(self, key), getattr(carver, key))
            for key in _CARVING_KEYS
            if getattr(self, key) != getattr(carver, key)
        }
        if mismatched:
            detail = ", ".join(
                f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in mismatched.items()
            )
            raise ConfigError(
                f"Cannot resume exactly: the checkpoint was carved differently ({detail}). "
                "Resume with the same dataset, global batch, seed and maximum worker count, or "
                "start a new run (new RunConfig name)."
            )

    def check_group_size(self, quantum: int) -> None:
        """Refuse to resume with another ghost BatchNorm group size (``quantum``: the run's
        ``BatchConfig.slice_quantum``, 1 when not ghost).

        The checkpoint's plans carry the group size they were cut in. A different one would
        normalise the resumed steps over other groups (another model hyper-parameter), even
        where the carving itself (``min_step_size``) happens to come out the same.

        Raises:
            ConfigError: Naming both group sizes and the fix.
        """
        if not self.plans or self.plans[-1].quantum == quantum:
            return

        def mode(g: int) -> str:
            return f"batchnorm: ghost with ghost_size {g}" if g > 1 else "no ghost BatchNorm"

        held = self.plans[-1].quantum
        raise ConfigError(
            f"Cannot resume: the checkpoint was trained with {mode(held)}, this run asks for "
            f"{mode(quantum)}. The ghost group size is fixed for a run; resume with "
            f"{mode(held)} (BatchConfig.batchnorm / ghost_size, train.ghost_size in YAML), or "
            "start a new run (new RunConfig name)."
        )

    def slot_costs(self) -> dict[int, CostModel]:
        """Cost model per worker slot measured by the group that wrote the state."""
        return slot_costs(self.plans, self.rank_slots)


def write_state(directory: Path, state: CheckpointState) -> Path:
    """Write ``state`` into a checkpoint directory (atomically); returns the file."""
    return atomic_write_json(Path(directory) / STATE_FILE, state.to_dict())


def read_state(directory: Path) -> CheckpointState | None:
    """The state in a checkpoint directory, or None if it has none.

    Raises:
        ConfigError: For an unknown format version or an unreadable file.
    """
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # a torn or corrupted file
        raise ConfigError(
            f"{path} is not valid JSON ({exc}): this checkpoint cannot be resumed exactly. "
            "Fix: resume from an earlier checkpoint, or start a new run (new RunConfig name)."
        ) from exc
    return CheckpointState.from_dict(data, source=str(path))


def require_state(directory: Path, source: str) -> CheckpointState:
    """The state of a checkpoint a run resumes from; a checkpoint without one is refused.

    Resuming without the cursor would restart the epoch and train on samples twice.
    ``source`` (where the checkpoint lives) is named in the error.

    Raises:
        ConfigError: The checkpoint has no state file, or an unreadable one.
    """
    state = read_state(directory)
    if state is None:
        raise ConfigError(
            f"The checkpoint to resume from ({source}) has no {STATE_FILE}: it was reported "
            "with ray.train.report instead of raytrain_hetero.report, or the file was lost. "
            "Without it the sample cursor is unknown and resuming would not be exactly-once. "
            "Fix: report checkpoints with raytrain_hetero.report; to start from such weights, "
            "load them in the loop from a path you pass in train_loop_config and start a new "
            "run (new RunConfig name)."
        )
    return state


def slot_costs(plans: Sequence[Plan], rank_slots: Sequence[int] | None) -> dict[int, CostModel]:
    """Cost model per worker slot from the newest plan of the group that wrote a checkpoint."""
    if not plans or not rank_slots:
        return {}
    newest = max(plans, key=lambda p: p.version)
    if newest.costs is None or newest.world_size != len(rank_slots):
        return {}
    return {int(slot): cost for slot, cost in zip(rank_slots, newest.costs)}
