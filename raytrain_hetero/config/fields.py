"""Field types and the error vocabulary shared by every config model (library and YAML).

Validators raise :func:`invalid` errors, which carry their own fix (and optionally a
sub-location); :mod:`raytrain_hetero.config.problems` renders them, and pydantic's own
errors, as ``key.path: what. Fix: how``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

__all__ = [
    "BOOL_AS_NUMBER",
    "INVALID",
    "MULTI",
    "Float",
    "Int",
    "NonNegFloat",
    "PositiveFloat",
    "PositiveInt",
    "Problem",
    "Problems",
    "absolute",
    "check_name",
    "invalid",
    "multiple",
]

# Custom pydantic error types; problems.describe knows how to render them.
INVALID = "hetero_invalid"  # ctx: message, fix, at (tuple: loc relative to the error's loc)
MULTI = "hetero_multi"  # ctx: problems: list of (loc tuple, message, fix)
BOOL_AS_NUMBER = "hetero_bool_as_number"  # ctx: expected

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

#: One problem found by a cross-field check: (location, what is wrong, how to fix it).
Problem = tuple[tuple[str | int, ...], str, str]


class Problems(list[Problem]):
    """The problems a cross-field check found, in order."""

    def add(self, at: tuple[str | int, ...], message: str, fix: str) -> None:
        """Record that ``at`` is wrong (``message``) and how to fix it."""
        self.append((at, message, fix))


def invalid(message: str, fix: str, at: tuple[str | int, ...] = ()) -> PydanticCustomError:
    """A validator error that carries its own fix (and optionally a sub-location)."""
    return PydanticCustomError(INVALID, "{message}", {"message": message, "fix": fix, "at": at})


def multiple(problems: list[Problem]) -> PydanticCustomError:
    """One validator error reporting several problems, each at its own location."""
    return PydanticCustomError(
        MULTI, "{summary}", {"summary": "; ".join(p[1] for p in problems), "problems": problems}
    )


def _reject_bool_int(value: Any) -> Any:
    # pydantic's lax mode turns ``true`` into 1; in a config that is always a mistake.
    if isinstance(value, bool):
        raise PydanticCustomError(BOOL_AS_NUMBER, "expected {expected}", {"expected": "an integer"})
    return value


def _reject_bool_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError(BOOL_AS_NUMBER, "expected {expected}", {"expected": "a number"})
    return value


Int = Annotated[int, BeforeValidator(_reject_bool_int)]
Float = Annotated[float, BeforeValidator(_reject_bool_float)]
NonNegFloat = Annotated[Float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[Float, Field(gt=0, allow_inf_nan=False)]
PositiveInt = Annotated[Int, Field(ge=1)]


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid name (letters, digits, ``_ . -``), else an :func:`invalid`."""
    if not value or not _NAME_RE.match(value):
        raise invalid(
            f"{what} {value!r} is not a valid name (it must be non-empty and use only "
            "letters, digits, '_', '.' and '-')",
            "use a name like 'fast', 'gpu-a100' or 'node_1'",
        )
    return value


def absolute(path: Path) -> Path:
    """``path`` with ``~`` expanded, made absolute against the current working directory."""
    return path.expanduser().absolute()
