"""Torch batch sampler and loader over :mod:`raytrain_hetero.core.carving`.

:class:`CarvingBatchSampler` yields this rank's indices of every global step under the plan
governing that step. :class:`HeteroDataLoader` wraps a torch ``DataLoader`` on it (with
:class:`CarvedStepLoader`'s step accounting, shared with the Ray Data source): one iteration
is one epoch (resuming mid-epoch), and handing out step s's batch begins the step on
:class:`~raytrain_hetero.worker.measure.timing.StepTiming` with its per-rank counts (the gradient and
BatchNorm weights). The counts are recomputed from the pure carving, not taken from the
sampler, so DataLoader prefetching cannot make them disagree.

A dataset read by drawn queries (torchgeo's ``GeoDataset``) is carved through
:class:`EpochDraws`: each epoch's draws are listed once, seeded by (seed, epoch), and their
positions carved like sample indices.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import PlanSchedule
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.worker.data.epoch_stream import EpochStream
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming
from raytrain_hetero.worker.setup.identity import RankIdentity

if TYPE_CHECKING:
    from raytrain_hetero.worker.measure.telemetry import Telemetry

logger = logging.getLogger(__name__)

_FORBIDDEN_LOADER_ARGS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
#: CarvedStepLoader's arguments (the rest of HeteroDataLoader's go to the DataLoader).
_STEP_ARGS = (
    "state",
    "schedule",
    "identity",
    "timing",
    "telemetry",
    "ensure_plan",
    "on_step_end",
    "before_epoch",
    "move_to_device",
)


@dataclass
class LoaderState:
    """Carving state of a worker (the cursor is advanced only by the loader).

    Attributes:
        cursor: Next step to run.
    """

    carver: EpochCarver
    cursor: Cursor


class EpochDraws(Dataset):
    """A sampler's draws of each epoch as a map-style dataset: item ``i`` reads draw ``i``.

    Epoch e's draws are the first ``length`` queries of a copy of ``sampler`` (batches
    flattened) with torch's global generator and the sampler's ``generator`` seeded by
    (seed, e): the same on every rank, new every epoch. ``len`` and ``[i]`` read epoch 0's
    draws (what the probes draw batches from).

    Args:
        sampler: Yields queries (or lists of queries) of ``dataset`` (a ``GeoDataset``).
        length: Draws per epoch; default ``sampler.length`` (torchgeo's samplers; a batch
            sampler's ``len()`` counts batches), else ``len(sampler)``.
    """

    def __init__(self, dataset: Any, sampler: Any, *, seed: int, length: int | None = None):
        self.dataset = dataset
        self.sampler = sampler
        self.seed = seed
        self.length = int(
            length if length is not None else getattr(sampler, "length", None) or len(sampler)
        )
        if self.length < 1:
            raise DataError(
                f"{type(sampler).__name__} draws no samples per epoch (length {self.length}). "
                "Fix: a region the patch size fits in, or a positive length."
            )
        self._cached: tuple[int, list[Any]] | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.queries(0)[index]]

    def queries(self, epoch: int) -> Sequence[Any]:
        """The epoch's ``length`` draws (the last epoch's list is kept)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._draw(epoch))
        return self._cached[1]

    def _draw(self, epoch: int) -> list[Any]:
        sampler = copy.copy(self.sampler)  # the datamodule's sampler keeps its generator
        seed = (self.seed * 1_000_003 + epoch) % 2**63
        draws: list[Any] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if hasattr(sampler, "generator"):
                sampler.generator = torch.Generator().manual_seed(seed)
            while len(draws) < self.length:  # a batch sampler may yield fewer (length % batch)
                before = len(draws)
                for item in sampler:
                    draws.extend(item) if isinstance(item, list) else draws.append(item)
                    if len(draws) >= self.length:
                        break
                if len(draws) == before:
                    raise DataError(
                        f"{type(self.sampler).__name__} yields no queries (len {len(sampler)}); "
                        "a batch sampler needs length >= its batch_size. Fix: raise length."
                    )
        return draws[: self.length]


class CarvingBatchSampler(Sampler[list[Any]]):
    """Yields this rank's dataset indices for each step of one epoch.

    Group reading (model-parallel modes): every rank of a group (one data-parallel replica)
    needs the replica's whole batch, so with ``readers`` each rank yields the union of its
    group's plan slices: one contiguous range (consecutive ranks' slices are adjacent), the
    same on every member, the groups' ranges tiling the global batch. The data plan stays per
    rank (a replica's slice is the sum of its members' speed shares), so planning, carving,
    exactly-once and checkpoint cursors work unchanged.

    Args:
        schedule: Plans of the worker group (read lazily, step by step).
        readers: Consecutive ranks whose slices this rank reads (its model-parallel group,
            which contains ``rank``); None or ``(rank,)``: its own slice.
        draws: An epoch's queries (:meth:`EpochDraws.queries`): yield the queries at the
            carved positions instead of the positions.
    """

    def __init__(
        self,
        carver: EpochCarver,
        schedule: PlanSchedule,
        rank: int,
        readers: tuple[int, ...] | None = None,
        draws: Callable[[int], Sequence[Any]] | None = None,
    ) -> None:
        readers = tuple(readers) if readers else (rank,)
        if rank not in readers or list(readers) != list(range(readers[0], readers[-1] + 1)):
            raise ConfigError(
                f"rank {rank} cannot read the slices of ranks {list(readers)}: a reading group "
                "is consecutive ranks containing the reader"
            )
        self.carver = carver
        self.schedule = schedule
        self.rank = rank
        self.readers = readers
        self.draws = draws
        self.epoch = 0
        self.start_step = 0
        self.onward = False

    def set_position(self, epoch: int, start_step: int, *, onward: bool = False) -> None:
        """Make the next iteration cover ``epoch`` from ``start_step`` to its end, and with
        ``onward`` every later epoch after it (one stream across epochs)."""
        self.epoch = epoch
        self.start_step = start_step
        self.onward = onward

    def ranges(self) -> Iterator[tuple[int, int, int]]:
        """``(step_in_epoch, lo, hi)``: the permutation positions this rank reads, step by step."""
        return self._ranges(self.epoch, self.start_step)

    def _ranges(self, epoch: int, start: int) -> Iterator[tuple[int, int, int]]:
        for k in range(start, self.carver.steps_per_epoch):
            global_step = epoch * self.carver.steps_per_epoch + k
            plan = self.schedule.plan_for(global_step)
            self.schedule.mark_carved(global_step)
            lo, _ = self.carver.rank_positions(k, plan, self.readers[0])
            _, hi = self.carver.rank_positions(k, plan, self.readers[-1])
            yield k, lo, hi

    def __iter__(self) -> Iterator[list[Any]]:
        # The position is read now, not at the first batch: a DataLoader makes its sampler's
        # iterator at once, and the next epoch's may be made while this one still runs.
        return self._batches(self.epoch, self.start_step, self.onward)

    def _batches(self, epoch: int, start: int, onward: bool) -> Iterator[list[Any]]:
        while True:
            permutation = self.carver.permutation(epoch)
            queries = self.draws(epoch) if self.draws is not None else None
            for _, lo, hi in self._ranges(epoch, start):
                ids = permutation[lo:hi]
                yield ids.tolist() if queries is None else [queries[i] for i in ids]
            if not onward:
                return
            epoch, start = epoch + 1, 0

    def __len__(self) -> int:
        return self.carver.steps_per_epoch - self.start_step


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Recursively move the tensors of a collated batch to ``device``, keeping its structure."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


class CarvedStepLoader:
    """One epoch per iteration of this rank's slices of every global batch.

    The step accounting every carved source shares (cursor, each step's plan and counts on
    the worker's timing, its record); a subclass says where a step's batch comes from
    (:meth:`_epoch_batches`). Use ``for epoch in range(loader.epoch, num_epochs): for batch
    in loader: ...``; after a restart it resumes exactly at the checkpointed step.

    Args:
        state: Carver and cursor (restored from the checkpoint already).
        ensure_plan: Called before each epoch; makes sure a plan exists (probing if needed).
        before_epoch: Called after ``ensure_plan`` and before the first batch of each
            iteration (restores the checkpoint's generator states once).
    """

    def __init__(
        self,
        *,
        state: LoaderState,
        schedule: PlanSchedule,
        identity: RankIdentity,
        timing: StepTiming,
        telemetry: Telemetry,
        ensure_plan: Callable[[], None],
        on_step_end: Callable[[StepRecord], None],
        before_epoch: Callable[[], None] | None = None,
        move_to_device: bool = True,
    ) -> None:
        self.state = state
        self.schedule = schedule
        self.identity = identity
        self.timing = timing
        self.telemetry = telemetry
        self._ensure_plan = ensure_plan
        self._on_step_end = on_step_end
        self._before_epoch = before_epoch
        self._move = move_to_device
        self._device = torch.device(identity.device)
        self._clock = ComputeClock(self._device)
        self.batch_sampler = CarvingBatchSampler(
            state.carver,
            schedule,
            identity.rank,
            identity.setup.reading_group(identity.rank, identity.world_size),
        )
        self._non_blocking = False
        # Loading times of the batch handed out last, until its step ends (finish_step).
        self._pending_load: tuple[float, float] | None = None
        # The iteration in progress: a superseded one (an unfinished generator closed late,
        # e.g. by a Lightning epoch that never resumes it) must not abandon the newer step.
        self._iteration: object | None = None
        #: ``len()`` counts the whole epoch, not what is left of it (set by the Lightning
        #: strategy: Lightning restores its own count of the epoch's batches done).
        self.len_counts_whole_epoch = False

    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Any]:
        """This rank's batches of ``epoch`` from step ``start`` on (one per step, in order)."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """Epoch the next iteration covers."""
        return self.state.cursor.epoch

    @property
    def steps_per_epoch(self) -> int:
        """Global steps in a whole epoch."""
        return self.state.carver.steps_per_epoch

    def __len__(self) -> int:
        if self.len_counts_whole_epoch:
            return self.steps_per_epoch
        return self.steps_per_epoch - self.state.cursor.step_in_epoch

    def state_dict(self) -> dict[str, int]:
        """The cursor, for a framework that checkpoints its loaders (Lightning's loop state)."""
        cursor = self.state.cursor
        return {"epoch": cursor.epoch, "step_in_epoch": cursor.step_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check a framework checkpoint's cursor against the one restored with the run's
        checkpoint (``prepare_data_loader`` restores it; this sets nothing).

        Raises:
            DataError: They differ: the framework would resume at another step than the
                carving, skipping or repeating steps.
        """
        cursor = self.state.cursor
        saved = Cursor(int(state["epoch"]), int(state["step_in_epoch"]))
        if saved != cursor:
            raise DataError(
                f"The checkpoint's loop state resumes at epoch {saved.epoch} step "
                f"{saved.step_in_epoch}, but the run's cursor is at epoch {cursor.epoch} step "
                f"{cursor.step_in_epoch}: the two were not saved together. Fix: resume from a "
                "checkpoint reported through raytrain_hetero.report."
            )

    def ensure_plan(self) -> None:
        """Probe and agree the first plan now (a collective), instead of at the first epoch."""
        self._ensure_plan()

    def __iter__(self) -> Iterator[Any]:
        state = self.state
        self._ensure_plan()
        if self._before_epoch is not None:
            self._before_epoch()
        epoch, start = state.cursor.epoch, state.cursor.step_in_epoch
        steps = state.carver.steps_per_epoch
        step = start
        batches = self._epoch_batches(epoch, start)
        iteration = self._iteration = object()
        try:
            while True:
                load_started = self._clock.now()
                load_wall_started = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                if self._move:
                    batch = move_to_device(batch, self._device, self._non_blocking)
                load_s = self._clock.now() - load_started
                load_wall_s = time.perf_counter() - load_wall_started
                self.telemetry.take()  # metrics logged between steps belong to no step
                self.telemetry.take_skipped()
                # Begun after the batch is on the device: loading is accounted separately.
                self.timing.begin(self._step_info(epoch, step))
                state.cursor = Cursor(epoch, step + 1) if step + 1 < steps else Cursor(epoch + 1, 0)
                self._pending_load = (load_s, load_wall_s)
                yield batch
                self.finish_step()
                step += 1
        finally:
            if self._iteration is iteration:
                self._pending_load = None
                self.timing.abandon()

    def finish_step(self) -> None:
        """End the step in progress and hand on its record; nothing if none is in progress.

        The loader calls it when asked for the next batch. A loop that stops asking after an
        epoch's last batch (Lightning's, which knows the loader's length) calls it itself
        after the optimizer update, so the last step of every epoch is recorded too.
        """
        pending, self._pending_load = self._pending_load, None
        if pending is not None and self.timing.current is not None:
            self._on_step_end(self._record(*pending))

    def _step_info(self, epoch: int, step_in_epoch: int) -> StepInfo:
        carver = self.state.carver
        global_step = epoch * carver.steps_per_epoch + step_in_epoch
        plan = self.schedule.plan_for(global_step)
        self.schedule.mark_carved(global_step)
        return StepInfo(
            global_step=global_step,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            counts=carver.step_counts(step_in_epoch, plan),
            rank=self.identity.rank,
            plan_version=plan.version,
        )

    def _record(self, load_s: float, load_wall_s: float) -> StepRecord:
        """End the step in progress and build its record."""
        step = self.timing.current
        times = self.timing.end()
        identity = self.identity
        # The loader-bound price: the wait for the slice (read in this process or by
        # DataLoader processes) is on the step's critical path as much as its compute.
        busy = times.busy_s + load_wall_s
        wall = times.wall_s
        return StepRecord(
            step=step.global_step,
            epoch=step.epoch,
            rank=identity.rank,
            worker=identity.spec.name,
            device=identity.device,
            slice=step.local_count,
            weight=step.weight(identity.setup.batch.weighting),
            compute_s=times.compute_s,
            load_s=load_s,
            busy_s=busy,
            samples_per_s=step.local_count / busy if busy > 0 else float("nan"),
            loss=self.telemetry.take().get("loss", float("nan")),
            global_samples_per_s=step.global_count / wall if wall > 0 else float("nan"),
            plan_version=step.plan_version,
            group=identity.group_id,
            world_size=identity.world_size,
            wall_s=wall,
            time=time.time(),
            skipped_nonfinite=self.telemetry.take_skipped(),
            overhead_s=self.telemetry.take_overhead(),
        )


class HeteroDataLoader(CarvedStepLoader):
    """:class:`CarvedStepLoader` over a map-style dataset through a torch ``DataLoader``.

    ``kwargs`` are :class:`CarvedStepLoader`'s arguments, then other ``DataLoader`` ones. An
    :class:`EpochDraws` dataset is read by its epochs' queries; in a model-parallel mode each
    rank reads its replica's slice (:class:`CarvingBatchSampler`).
    """

    def __init__(self, dataset: Dataset, **kwargs: Any) -> None:
        steps = {k: kwargs.pop(k) for k in _STEP_ARGS if k in kwargs}
        dataloader_kwargs = kwargs
        bad = [k for k in _FORBIDDEN_LOADER_ARGS if k in dataloader_kwargs]
        if bad:
            raise ConfigError(
                f"prepare_data_loader got {', '.join(bad)}: raytrain_hetero carves every global "
                "batch itself. Set global_batch_size on HeteroTrainer and drop these arguments."
            )
        super().__init__(**steps)
        self.dataset = dataset
        # A DataLoader iterator draws its workers' base seed from a generator: from torch's
        # global one by default, which would shift every later draw (Dropout) by where an
        # epoch started. Our own generator, seeded per epoch, leaves the global one alone.
        self._generator: torch.Generator | None = None
        if dataloader_kwargs.get("generator") is None:
            self._generator = torch.Generator()
            dataloader_kwargs["generator"] = self._generator
        if isinstance(dataset, EpochDraws):  # read the epoch's queries at the carved positions
            self.batch_sampler.draws = dataset.queries
        self.loader = DataLoader(
            dataset.dataset if isinstance(dataset, EpochDraws) else dataset,
            batch_sampler=self.batch_sampler,
            **dataloader_kwargs,
        )
        self._non_blocking = bool(dataloader_kwargs.get("pin_memory", False))
        # With DataLoader processes, the next epoch's first slices are read while this
        # epoch's last steps run (its order is known: the carving is seeded).
        self._stream: EpochStream | None = None
        if self.loader.num_workers > 0:
            self._stream = EpochStream(
                self.loader, self.batch_sampler, self._seed_epoch, self.steps_per_epoch
            )

    def _seed_epoch(self, epoch: int) -> None:
        """Seed the DataLoader's generator for ``epoch`` (before its iterator is made)."""
        if self._generator is not None:
            self._generator.manual_seed((self.state.carver.seed * 1_000_003 + epoch) % 2**63)

    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Any]:
        if self._stream is not None:
            return self._stream.epoch(epoch, start)
        self.batch_sampler.set_position(epoch, start)
        self._seed_epoch(epoch)
        return iter(self.loader)
