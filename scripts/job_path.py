"""Follow a JobConfig from ``raytrain-hetero train`` to the trainer and map its path.

Runs ``raytrain-hetero train --config FILE --output <scratch> --no-progress [--set ...]`` in
this process (the CLI's own ``main``) with :func:`sys.setprofile` recording the module of every
Python call of ``raytrain_hetero``'s source files (generated code, such as a dataclass's
``__init__``, is no module's) that receives the job object as an argument (``self`` included): the ``JobConfig``, one of its sections (an instance of the class of a ``JobConfig``
field, or a list of them, such as ``workers``), or the resolved job
(``raytrain_hetero.app.resolved.ResolvedJob``, where it exists). The path starts when the CLI
has loaded the job (loading validates it: the schema's own business) and ends at the call of
``HeteroTrainer.__init__``: the trainer is reached, the run is stopped there.

It prints the path (the modules in the order the job object passes them, consecutive calls in
one module as one step) and three figures: the modules passed; the climbs (steps to a module
of a higher layer than the one the path leaves, in the layer order of
``../shared/tools/check_import_cycles.py``; inside one layer, none); the re-entries (steps into
a module the path had left). It also says whether Ray was up when the trainer was reached.

Usage (from the repository root; ``--src`` maps another checkout, e.g. a ``git worktree``)::

    python scripts/job_path.py [--config examples/configs/eurosat_local.yaml]
        [--set KEY=VALUE ...] [--src DIR] [--start-ray] [--json]

Not part of the wheel; ``tests/unit/test_job_path.py`` runs the same trace.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Package layers, low to high (the order of ../shared/tools/check_import_cycles.py).
LAYERS = (
    "errors",
    "atomic",
    "core",
    "config",
    "sim",
    "worker",
    "workloads",
    "storage",
    "parallel",
    "driver",
    "inference",
    "tune",
    "app",
    "bench",
)

DEFAULT_CONFIG = "examples/configs/eurosat_local.yaml"
PACKAGE = "raytrain_hetero"
_START = (f"{PACKAGE}.app.cli", "_load_job")  # returns the loaded job
_STOP = (f"{PACKAGE}.driver.trainer", "HeteroTrainer.__init__")


def layer(module: str) -> int | None:
    """The layer index of a package module (``None``: the package root or an unknown name)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


@dataclass(frozen=True)
class PathMap:
    """The job object's path from the loaded job to the trainer.

    Attributes:
        calls: ``(module, function)`` of every call that received the job object, in order.
        reached_trainer: The path got to ``HeteroTrainer.__init__``.
        ray_started: Ray was initialised when the trainer was reached.
        exit_status: The CLI's exit status if it returned (an error it reported), else None.
    """

    calls: tuple[tuple[str, str], ...]
    reached_trainer: bool
    ray_started: bool
    exit_status: int | None = None
    steps: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        steps: list[str] = []
        for module, _ in self.calls:
            if not steps or steps[-1] != module:
                steps.append(module)
        object.__setattr__(self, "steps", tuple(steps))

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules passed, in the order of their first pass."""
        return tuple(dict.fromkeys(self.steps))

    @property
    def climbs(self) -> tuple[tuple[str, str], ...]:
        """Each step of the path from a module to one of a higher layer."""
        return tuple(
            (a, b)
            for a, b in zip(self.steps, self.steps[1:], strict=False)
            if (la := layer(a)) is not None and (lb := layer(b)) is not None and lb > la
        )

    @property
    def reentries(self) -> tuple[str, ...]:
        """Each step into a module the path had already passed and left."""
        seen: set[str] = set()
        again = []
        for module in self.steps:
            if module in seen:
                again.append(module)
            seen.add(module)
        return tuple(again)

    def report(self) -> str:
        """The path and its figures, as printed."""
        short = [s.removeprefix(f"{PACKAGE}.") for s in self.steps]
        lines = ["path: " + " -> ".join(short)]
        lines.append(
            f"modules {len(self.modules)}; climbs {len(self.climbs)}; "
            f"re-entries {len(self.reentries)}"
        )
        if self.climbs:
            lines.append(
                "climbs: "
                + ", ".join(
                    f"{a.removeprefix(PACKAGE + '.')} -> {b.removeprefix(PACKAGE + '.')}"
                    for a, b in self.climbs
                )
            )
        if self.reentries:
            lines.append(
                "re-entered: " + ", ".join(m.removeprefix(PACKAGE + ".") for m in self.reentries)
            )
        lines.append(
            f"trainer reached: {'yes' if self.reached_trainer else 'no'}; "
            f"Ray up by then: {'yes' if self.ray_started else 'no'}"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The map as JSON-ready data (with its figures)."""
        return {
            **asdict(self),
            "modules": list(self.modules),
            "climbs": [list(c) for c in self.climbs],
            "reentries": list(self.reentries),
        }


class _TrainerReached(BaseException):
    """Raised from the profiler at the trainer's constructor: the path ends there (a
    BaseException, so the CLI's own ``except Exception`` lets it through)."""


def job_types() -> tuple[type, ...]:
    """The classes of the job object: ``JobConfig``, its fields' classes and, where the
    checkout has one, the resolved job."""
    from pydantic import BaseModel

    from raytrain_hetero.app.config import JobConfig

    found: set[type] = {JobConfig}
    for info in JobConfig.model_fields.values():
        for kind in _annotation_types(info.annotation):
            if issubclass(kind, BaseModel):
                found.add(kind)
    try:
        from raytrain_hetero.app.resolved import ResolvedJob
    except ImportError:  # a checkout from before the resolved job
        pass
    else:
        found.add(ResolvedJob)
    return tuple(sorted(found, key=lambda t: t.__name__))


def _annotation_types(annotation: Any) -> list[type]:
    """The classes an annotation names, unions and containers unpacked."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _annotation_types(arg)]


def _is_job(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, kinds):
        return True
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(item, kinds) for item in value)
    )


def _arguments(frame: types.FrameType) -> list[Any]:
    """The values a call received: its named, keyword-only, ``*args`` and ``**kwargs``."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    values = [frame.f_locals.get(name) for name in names]
    if code.co_flags & 0x04:  # *args
        values.extend(frame.f_locals.get(code.co_varnames[count], ()))
        count += 1
    if code.co_flags & 0x08:  # **kwargs
        values.extend(frame.f_locals.get(code.co_varnames[count], {}).values())
    return values


def follow_train_path(
    config: str | Path = DEFAULT_CONFIG, overrides: Sequence[str] = (), *, start_ray: bool = False
) -> PathMap:
    """Run ``raytrain-hetero train`` on ``config`` (with ``--set`` ``overrides``) up to the
    trainer and return the job object's path (see the module). ``start_ray``: start an
    embedded local Ray before the trace (and stop it after), for a checkout whose path starts
    Ray before it reaches the trainer (its ``init_ray`` then finds Ray up, as in a notebook).
    """
    from raytrain_hetero.app.cli import main

    # Imported before the trace: a module's body receives no job, and the profiler slows it.
    for heavy in (f"{PACKAGE}.app.job", f"{PACKAGE}.driver.trainer"):
        importlib.import_module(heavy)
    if start_ray:
        from raytrain_hetero.driver.session import init_ray

        init_ray(num_cpus=4)

    kinds = job_types()
    calls: list[tuple[str, str]] = []
    state = {"following": False, "reached": False, "ray": False}

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE + ".") or frame.f_code.co_filename.startswith("<"):
            return  # another package's, or generated code (a dataclass's __init__)
        where = (module, frame.f_code.co_qualname)
        if event == "return":
            if where == _START:
                state["following"] = True
            return
        if not state["following"] or not any(_is_job(v, kinds) for v in _arguments(frame)):
            return
        calls.append(where)
        if where == _STOP:
            ray = sys.modules.get("ray")
            state["reached"] = True
            state["ray"] = bool(ray is not None and ray.is_initialized())
            sys.setprofile(None)
            raise _TrainerReached

    scratch = Path(tempfile.mkdtemp(prefix="rh-job-path-"))
    argv = ["train", "--config", str(config), "--output", str(scratch / "out"), "--no-progress"]
    for override in overrides:
        argv += ["--set", override]
    status = None
    sys.setprofile(profile)
    try:
        status = main(argv)
    except _TrainerReached:
        pass
    finally:
        sys.setprofile(None)
        shutil.rmtree(scratch, ignore_errors=True)
        if start_ray:
            import ray

            ray.shutdown()
    return PathMap(
        calls=tuple(calls),
        reached_trainer=state["reached"],
        ray_started=state["ray"],
        exit_status=status,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the path of ``raytrain-hetero train`` (see the module); 1 if the trainer was
    not reached."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="job config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--src", type=Path, default=None, help="checkout whose raytrain_hetero to map"
    )
    parser.add_argument(
        "--start-ray",
        action="store_true",
        help="start a local Ray before the trace (a checkout that starts Ray before the trainer)",
    )
    parser.add_argument("--json", action="store_true", help="print the map as JSON")
    args = parser.parse_args(argv)
    if args.src is not None:
        sys.path.insert(0, str(args.src.resolve()))
    import raytrain_hetero

    path = follow_train_path(args.config, args.overrides, start_ray=args.start_ray)
    print(f"package: {Path(raytrain_hetero.__file__).parent}")
    print(json.dumps(path.to_dict(), indent=2) if args.json else path.report())
    return 0 if path.reached_trainer else 1


if __name__ == "__main__":
    sys.exit(main())
