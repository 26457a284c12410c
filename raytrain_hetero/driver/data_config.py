"""Ray Train's ``DataConfig`` for ``HeteroTrainer(datasets=...)``: one dataset carved by the plan.

Ray Train hands ``datasets`` to :meth:`HeteroDataConfig.configure` once per worker group
(Ray Train V2's dataset manager, when rank 0 first calls ``get_dataset_shard``). The stock
config splits each dataset with ``streaming_split(world_size, equal=True)``: equal rows per
rank (dropping the excess), blocks handed to whichever rank pulls. Equal splits cannot follow a
plan whose slices change per step, and ranks pulling independently cannot end an epoch at the
same step. So the carved dataset (``carve``, ``"train"`` by default) is read by ONE stream
server actor in Ray's own streaming executor (``iter_batches``: reads and ``map_batches``
decode/augment run as Ray Data tasks wherever Ray schedules them, on training nodes or not):
the stream's global order is cut into the carving's global steps and every rank fetches the
positions of its slice (:class:`~raytrain_hetero.core.row_stream.EpochStreams`). Every row
once per epoch, the same steps on every rank, slices per the current plan, memory bounded by
the few global batches the ranks are apart.

Other datasets (validation) are split with ``streaming_split(world_size, equal=False)``:
every row once across the ranks, in uneven counts, for evaluation (no lockstep needed);
datasets outside ``datasets_to_split`` come whole to every rank, as in Ray.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import ray
from ray.train import DataConfig
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytrain_hetero.core.row_stream import Chunk, EpochStreams
from raytrain_hetero.worker.data.ray_data import CarvedShard

if TYPE_CHECKING:
    from ray.data import Dataset, ExecutionOptions

logger = logging.getLogger(__name__)

__all__ = ["HeteroDataConfig", "StreamServer"]


class StreamServer:
    """Actor: one pass over the carved dataset per epoch, cut into the ranks' row ranges.

    Args:
        dataset: The carved dataset (its execution options set).
        rows: Rows of one epoch.
        world_size: Ranks of the worker group.
    """

    def __init__(self, dataset: Dataset, rows: int, world_size: int) -> None:
        self.dataset = dataset
        self.streams = EpochStreams(rows, world_size, self._open)

    def _open(self, epoch: int) -> Iterator[Chunk]:
        logger.info("epoch %d: streaming %s", epoch, self.dataset.name)
        # Whole blocks (batch_size=None): the server re-cuts them into the plan's slices.
        return iter(self.dataset.iter_batches(batch_size=None, batch_format="numpy"))

    def take(self, epoch: int, step_start: int, lo: int, hi: int, rank: int) -> Chunk:
        """Rank ``rank``'s rows ``[lo, hi)`` of ``epoch`` (see :class:`EpochStreams`)."""
        return self.streams.take(epoch, step_start, lo, hi, rank)


class HeteroDataConfig(DataConfig):
    """``ray.train.DataConfig`` that carves one dataset by the plan (see the module).

    Args:
        carve: Name of the dataset to carve (read with :func:`raytrain_hetero.get_dataset_shard`).
        datasets_to_split: As Ray's: datasets split across ranks ("all" or names); the
            carved one always is.
        execution_options: As Ray's: Ray Data execution options, one for all datasets or
            per name (``preserve_order=True`` makes a mid-epoch resume exact).
        enable_shard_locality: As Ray's, for the datasets split with ``streaming_split``.
    """

    def __init__(
        self,
        carve: str = "train",
        datasets_to_split: Literal["all"] | list[str] = "all",
        execution_options: ExecutionOptions | dict[str, ExecutionOptions] | None = None,
        enable_shard_locality: bool = True,
    ) -> None:
        if datasets_to_split != "all" and carve not in datasets_to_split:
            datasets_to_split = [*datasets_to_split, carve]  # the carved dataset is split
        super().__init__(datasets_to_split, execution_options, enable_shard_locality)
        self.carve = carve
        self.datasets_to_split = datasets_to_split
        self.execution_options = execution_options
        self.enable_shard_locality = enable_shard_locality

    def options_for(self, name: str) -> ExecutionOptions:
        """The execution options of dataset ``name`` (a copy: callers may change it)."""
        given = self.execution_options
        if isinstance(given, dict):
            given = given.get(name)
        return copy.deepcopy(given or self.default_ingest_options())

    def configure(
        self,
        datasets: dict[str, Dataset],
        world_size: int,
        worker_handles: list[Any] | None,
        worker_node_ids: list[str] | None,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Per rank: a :class:`CarvedShard` for the carved dataset, ``DataIterator`` s else."""
        output: list[dict[str, Any]] = [{} for _ in range(world_size)]
        split = set(datasets) if self.datasets_to_split == "all" else set(self.datasets_to_split)
        hints = worker_node_ids if self.enable_shard_locality else None
        for name, dataset in datasets.items():
            ds = dataset.copy(dataset)
            if ds.name is None:
                ds.set_name(name)
            ds.context.execution_options = self.options_for(name)
            if name == self.carve:
                shard = self._carved(name, ds, world_size)
                for per_rank in output:
                    per_rank[name] = shard
            elif name in split:
                # equal=False: no row dropped; a faster rank evaluates more rows.
                parts = ds.streaming_split(world_size, equal=False, locality_hints=hints)
                for per_rank, part in zip(output, parts, strict=True):
                    per_rank[name] = part
            else:
                for per_rank in output:
                    per_rank[name] = ds.iterator()
        return output

    def _carved(self, name: str, ds: Dataset, world_size: int) -> CarvedShard:
        # One streaming pass when the row count is not in the files' metadata (parquet's is).
        rows = ds.count()
        logger.info("carving dataset %r: %d rows per epoch over %d ranks", name, rows, world_size)
        here = ray.get_runtime_context().get_node_id()
        server = (
            ray.remote(StreamServer)
            .options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
            )
            .remote(ds, rows, world_size)
        )
        return CarvedShard(name=name, rows=rows, server=server)
