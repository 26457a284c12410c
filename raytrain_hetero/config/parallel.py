"""How the model is parallelised: data parallelism, speed-proportional conv split, branches."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import PositiveInt, invalid

__all__ = ["ParallelConfig", "ParallelMode"]

ParallelMode = Literal["data", "conv_split", "branches"]


class ParallelConfig(HeteroModel):
    """The parallel layout of the workers.

    The workers are cut into model-parallel groups of ``group_size`` consecutive ranks; each
    group is one data-parallel replica. Every rank of a group reads its replica's carved slice
    of the global batch (the union of its members' plan slices), the replicas' gradients are
    weighted by the samples each replica processed (exact, as in data parallelism).

    Attributes:
        mode: ``"data"``: every rank holds the whole model (heterogeneous data parallelism).
            ``"conv_split"``: the output channels (kernels) of each of ``layers`` are split
            over the ranks of a group in proportion to each rank's measured per-kernel cost.
            ``"branches"``: the modality branches of a multimodal model are placed on
            different ranks of a group (heavier branch on the faster rank), the fusion head on
            one of them, micro-batches pipelined.
        layers: ``conv_split`` only: names of the ``nn.Conv2d`` modules to split (as in
            ``model.named_modules()``).
        group_size: Ranks per model-parallel group (``None``: all ranks, one replica). Must
            divide the number of workers.
        micro_batches: ``branches`` only: micro-batches per step (pipelining depth).
    """

    mode: ParallelMode = "data"
    layers: tuple[str, ...] = ()
    group_size: PositiveInt | None = None
    micro_batches: PositiveInt = 2

    @model_validator(mode="after")
    def _consistent(self) -> ParallelConfig:
        if self.mode == "conv_split" and not self.layers:
            raise invalid(
                "conv_split needs the layers to split",
                "name the Conv2d modules, e.g. layers: [conv1, conv2]",
                ("layers",),
            )
        if self.mode != "conv_split" and self.layers:
            raise invalid(
                f"layers are only used by mode conv_split (mode is {self.mode})",
                "remove layers or set mode: conv_split",
                ("layers",),
            )
        if len(set(self.layers)) != len(self.layers):
            raise invalid(
                f"a layer is named twice in {list(self.layers)}",
                "name each layer once",
                ("layers",),
            )
        if self.mode == "data" and self.group_size not in (None, 1):
            raise invalid(
                "group_size applies to the model-parallel modes only",
                "remove group_size or set mode: conv_split or branches",
                ("group_size",),
            )
        if self.mode != "data" and self.group_size == 1:
            raise invalid(
                f"a {self.mode} group of one rank splits nothing",
                "set group_size >= 2 (or null for all ranks), or mode: data",
                ("group_size",),
            )
        return self

    @property
    def model_parallel(self) -> bool:
        """True for the conv_split and branches modes."""
        return self.mode != "data"

    def ranks_per_group(self, world_size: int) -> int:
        """Ranks per model-parallel group in a world of ``world_size`` ranks (1 in data mode)."""
        if not self.model_parallel:
            return 1
        return world_size if self.group_size is None else self.group_size

    def groups(self, world_size: int) -> tuple[tuple[int, ...], ...]:
        """The model-parallel groups (consecutive ranks) of a world of ``world_size`` ranks.

        Raises:
            ConfigError: ``group_size`` does not divide ``world_size``, or a model-parallel
                group would have fewer than two ranks.
        """
        from raytrain_hetero.errors import ConfigError

        size = self.ranks_per_group(world_size)
        if self.mode == "data":
            return tuple((rank,) for rank in range(world_size))
        if world_size % size or size < 2:
            raise ConfigError(
                f"parallel.group_size {size} does not cut {world_size} worker(s) into groups "
                f"of >= 2 ranks. Fix: choose a group_size that divides the number of workers."
            )
        return tuple(tuple(range(s, s + size)) for s in range(0, world_size, size))
