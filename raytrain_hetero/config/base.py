"""The base of every config model: frozen, no unknown keys, ConfigError on bad values."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from raytrain_hetero.config.problems import raise_validation_error

__all__ = ["HeteroModel"]


class HeteroModel(BaseModel):
    """Frozen pydantic model that rejects unknown keys.

    Built from Python (``BatchConfig(global_batch_size=0)``), bad values raise one
    :class:`~raytrain_hetero.errors.ConfigError` naming each field and its fix, never a raw
    pydantic ``ValidationError``. Nested inside a larger model (the YAML job schema) the
    outer validation reports the problems with their full key paths instead.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise_validation_error(exc, type(self))

    # Tell pydantic this is its own __init__ in disguise: nested validation (the YAML job
    # validating its sections) then skips it and reports structured errors at full paths.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]
