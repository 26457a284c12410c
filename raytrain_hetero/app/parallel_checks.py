"""Checks of a job's ``parallel:`` section against its model, before any worker starts.

:func:`parallel_setting_problems` (YAML load time, pure): branch placement against the model
name (the layout against the workers is :func:`~raytrain_hetero.config.run_setting_problems`'s).
:func:`check_parallel_fits_model` (driver, once the data fixed the band count): the built
model's split layers and declared branches against the group size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raytrain_hetero.config.fields import Problem, Problems
from raytrain_hetero.config.problems import closest
from raytrain_hetero.errors import ConfigError, ModelParallelError

if TYPE_CHECKING:
    from torch import nn

    from raytrain_hetero.app.sections import ModelConfig
    from raytrain_hetero.config import ParallelConfig

__all__ = ["check_parallel_fits_model", "parallel_setting_problems"]

#: Models of the job schema that declare modality branches (``parallel.DeclaresBranches``).
BRANCH_MODELS: tuple[str, ...] = ("fusion_cnn",)


def parallel_setting_problems(parallel: ParallelConfig, model: ModelConfig) -> list[Problem]:
    """What is wrong with a job's ``parallel`` section given its ``model`` section (the
    layout against the workers and weighting is
    :func:`~raytrain_hetero.config.run_setting_problems`'s).

    Returns:
        One ``(location, message, fix)`` per problem (empty when the section fits).
    """
    if not parallel.model_parallel:
        return []
    problems = Problems()
    mode = parallel.mode
    if mode == "branches":
        if model.name not in BRANCH_MODELS:
            problems.add(
                ("parallel", "mode"),
                f"branch placement needs a model that declares modality branches; "
                f"{model.name} does not (models with branches: {', '.join(BRANCH_MODELS)})",
                "use model.name: fusion_cnn (dataset multimodal), or parallel.mode: "
                "data or conv_split",
            )
        elif model.modalities is not None and len(model.modalities) < 2:
            problems.add(
                ("parallel", "mode"),
                f"model.modalities {list(model.modalities)} builds one branch: there is "
                "nothing to place on a second rank",
                "use model.modalities: [s1, s2], or parallel.mode: data",
            )
    return problems


def _conv_names(model: nn.Module) -> list[str]:
    from torch import nn

    return [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]


def check_parallel_fits_model(parallel: ParallelConfig, model: nn.Module, world_size: int) -> None:
    """Check ``parallel`` against the job's model, built once on the driver's CPU.

    Raises:
        ConfigError: A ``parallel.layers`` entry that is missing, not a plain ungrouped
            ``nn.Conv2d``, or narrower than a group; a branch placement of a model without two
            or more declared branches, or a group size that does not fit them.
    """
    if parallel.mode == "data":
        return  # the whole model on every rank: nothing to place
    from raytrain_hetero.core.branch_placement import check_branch_group
    from raytrain_hetero.parallel.branches import branch_model_of
    from raytrain_hetero.parallel.conv_split import check_splittable

    group = parallel.ranks_per_group(world_size)
    kind = type(model).__name__
    if parallel.mode == "conv_split":
        convs = _conv_names(model)
        modules = dict(model.named_modules())
        for name in parallel.layers:
            try:
                check_splittable(name, modules.get(name) if name else None, group)
            except ModelParallelError as exc:
                hint = closest(name, convs) if name not in modules else None
                raise ConfigError(
                    f"parallel.layers: {exc}. The {kind} of this job has the Conv2d layers "
                    f"{', '.join(convs) or '(none)'}"
                    + (f"; did you mean {hint!r}?" if hint else ".")
                    + " Fix: list Conv2d layers of the model in parallel.layers, or use "
                    "parallel.mode: data."
                ) from None
    elif parallel.mode == "branches":
        try:
            branches = branch_model_of(model).branch_names
        except ModelParallelError as exc:
            raise ConfigError(f"parallel.mode branches: {exc}") from None
        if len(branches) < 2:
            raise ConfigError(
                f"parallel.mode branches: the {kind} declares only the branch(es) "
                f"{list(branches)}; placement needs two or more. Fix: build the model with "
                "several branches (model.modalities), or use parallel.mode: data."
            )
        try:
            check_branch_group(branches, group)
        except ModelParallelError as exc:
            raise ConfigError(
                f"parallel.group_size: {exc} (and the workers to a multiple). Fix: change "
                "parallel.group_size, or use parallel.mode: data."
            ) from None
