"""A Ray Data stream carved by the plan: this rank's slice of every global batch.

:class:`~raytrain_hetero.driver.data_config.HeteroDataConfig` (the run's ``DataConfig``) hands
every rank a :class:`CarvedShard` for the dataset it carves: the row count of one epoch and
the handle of the one stream server that reads the dataset. The rank turns it into a
:class:`RayDataShard`, a :class:`~raytrain_hetero.worker.data.sampler.CarvedStepLoader` whose
batches are the stream positions the map-style carving assigns it (the identity permutation:
Ray Data decides the order, e.g. ``random_shuffle()`` in the pipeline), fetched from the
server a few steps ahead and converted to torch tensors like Ray's ``iter_torch_batches``.
Everything else (cursor, plans, records, checkpoints, plan switches at the first step no rank
has fetched) is the map-style loader's.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.data.sampler import CarvedStepLoader

logger = logging.getLogger(__name__)

__all__ = ["CarvedShard", "RayDataShard"]

_REFUSED = {
    "batch_size": "the plan carves every global batch: set BatchConfig.global_batch_size",
    "drop_last": "every row is used once per epoch; the carving merges a short tail",
    "local_shuffle_buffer_size": "shuffle in the pipeline (ds.random_shuffle() or "
    "ds.randomize_block_order()): every rank must cut the same global order",
    "local_shuffle_seed": "shuffle in the pipeline, not per rank",
}


@dataclass(frozen=True)
class CarvedShard:
    """What ``ray.train.get_dataset_shard`` returns for the carved dataset (picklable).

    Attributes:
        name: The dataset's name in ``datasets=``.
        rows: Rows of one epoch (counted once per worker group).
        server: Handle of the stream server actor that cuts the rows.
    """

    name: str
    rows: int
    server: Any


def _to_tensor(column: np.ndarray, dtype: torch.dtype | None) -> Any:
    if column.dtype == object:  # ragged rows (images of different sizes): left to collate_fn
        return column
    # Arrays out of the object store are read-only; torch wants writable memory.
    return torch.as_tensor(np.array(column, copy=not column.flags.writeable), dtype=dtype)


class RayDataShard(CarvedStepLoader):
    """This rank's slices of a carved Ray Data stream; each iteration is one epoch.

    Obtained from :func:`raytrain_hetero.get_dataset_shard`. Ray's idiom works unchanged::

        for epoch in range(shard.epoch, epochs):        # shard.epoch: the resume epoch
            for batch in shard.iter_torch_batches(dtypes=torch.float32):
                ...                                     # {column: tensor}, this rank's rows

    Args:
        shard: The carved dataset's handle.
        **kwargs: :class:`~raytrain_hetero.worker.data.sampler.CarvedStepLoader`'s arguments.
    """

    def __init__(self, shard: CarvedShard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self._prefetch = 1
        self._dtypes: torch.dtype | Mapping[str, torch.dtype] | None = None
        self._collate: Callable[[dict[str, np.ndarray]], Any] | None = None
        self._pin = False

    def iter_torch_batches(
        self,
        *,
        prefetch_batches: int = 1,
        dtypes: torch.dtype | Mapping[str, torch.dtype] | None = None,
        device: str | torch.device = "auto",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        pin_memory: bool = False,
        **refused: Any,
    ) -> RayDataShard:
        """Ray's ``DataIterator.iter_torch_batches`` arguments, less those the carving decides.

        Args:
            prefetch_batches: Steps fetched ahead of the one being trained on (>= 0).
            dtypes: Torch dtype of every column, or per column.
            device: ``"auto"``: the worker's device; a device; or None to keep batches on CPU.
            collate_fn: ``fn({column: ndarray}) -> batch`` in place of the tensor conversion.
            pin_memory: Pin host memory before the copy to the device.

        Returns:
            This shard, set up so; iterate it for one epoch from the cursor.

        Raises:
            ConfigError: ``batch_size``, ``drop_last`` or a local shuffle (naming why).
        """
        if refused:
            why = "; ".join(
                f"{k}: {_REFUSED.get(k, 'not a DataIterator argument')}" for k in refused
            )
            raise ConfigError(f"iter_torch_batches of a carved Ray Data shard: {why}.")
        if prefetch_batches < 0:
            raise ConfigError(f"prefetch_batches must be >= 0, got {prefetch_batches}.")
        self._prefetch, self._dtypes, self._collate = prefetch_batches, dtypes, collate_fn
        self._move = device is not None
        if device is not None:
            self._device = torch.device(self.identity.device if device == "auto" else device)
        self._non_blocking = self._pin = pin_memory
        return self

    def _convert(self, rows: dict[str, np.ndarray]) -> Any:
        if self._collate is not None:
            return self._collate(rows)
        dtypes = self._dtypes
        batch = {
            k: _to_tensor(v, dtypes.get(k) if isinstance(dtypes, Mapping) else dtypes)
            for k, v in rows.items()
        }
        if self._pin:
            batch = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in batch.items()}
        return batch

    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Any]:
        sampler, carver = self.batch_sampler, self.state.carver
        sampler.set_position(epoch, start)
        server, rank = self.shard.server, self.identity.rank
        in_flight: deque[Any] = deque()
        # Asking for a step marks it carved, so a plan switch lands after the prefetched steps.
        for k, lo, hi in sampler.ranges():
            step_start, _ = carver.step_bounds(k)
            in_flight.append(server.take.remote(epoch, step_start, lo, hi, rank))
            if len(in_flight) > self._prefetch:
                yield self._convert(ray.get(in_flight.popleft()))
        while in_flight:
            yield self._convert(ray.get(in_flight.popleft()))
