"""``python -m benchmarks device --output DIR``: the checks a lent GPU machine runs, in one go.

Sized for a lent machine (16 cores, one GPU, no network; 8 minutes in all, ``--budget-s``):
everything comes from the repository and its environment (the synthetic data is generated on
the spot, as every scenario's). Parts, in order, each a scenario of :mod:`benchmarks.scenarios`
run by :func:`benchmarks.runner.run_scenario` in its own Ray session, one fit per contender:

* **a** ``cpu-gpu``: the library's defaults (``hetero-live``) against the GPU worker alone
  (``gpu-alone``), loader processes on the GPU rank (``--gpu-loader-workers 2``);
* **c** exact against ghost BatchNorm on the GPU: ``hetero-ghost32`` in the same run as
  part a (the defaults' BatchNorm is exact), so a and c share one session;
* **b** ``cpu-real3``: CPU workers of 8, 4 and 2 cores pinned to disjoint cores, no
  emulation, the defaults against stock and the ideal (B / the sum of each worker's samples/s
  measured alone, the efficiency's denominator).

It prints one table (``table.txt``) and writes ``device.json`` (every part's full scenario
result, the machine, the command) under ``--output``, after each part: a run cut short keeps
the parts done. A part whose estimate exceeds the budget left is skipped, and says so.

``--dry-run`` runs the same parts on a CPU machine in about a minute: tiny data, model and
steps, the GPU worker replaced by a CPU stand-in (``gpu-alone`` runs the stand-in alone), part
b on two one-core workers pinned to one core each. ``tests/unit/test_bench_device.py`` runs
it.

Another check joins by registering a :class:`DevicePart` (:func:`register_part`) in a module
listed in :data:`PART_MODULES` (imported before the parts run): issue 44's tune check
(part ``t``) is registered there; it needs a call of its own (``--parts t --budget-s 480``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "PARTS",
    "PART_MODULES",
    "DevicePart",
    "DeviceRun",
    "Row",
    "format_device_table",
    "main",
    "register_part",
]

#: Modules that register further parts when imported (e.g. issue 44's tune check).
#: Modules that register more parts. Issue 44's tune check (part ``t``, about 330 s) does not
#: fit the default budget after a, b and c: run it alone with ``--parts t --budget-s 480``.
PART_MODULES: tuple[str, ...] = ("benchmarks.tune_device_part",)


@dataclass(frozen=True)
class Row:
    """One line of the device table.

    Attributes:
        part: The part's key. check: What is checked. contender: Whose figure.
        samples_per_s: Its samples/s. reference: What it is held against (a contender,
        ``ideal``), "" for none. ratio: samples/s over the reference's. goal: The target
        (e.g. ``>= 1.0``), "" for none. met: Whether the goal is met (None: no goal).
        note: Anything else (final accuracy, plan).
    """

    part: str
    check: str
    contender: str
    samples_per_s: float
    reference: str = ""
    ratio: float = math.nan
    goal: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class DeviceRun:
    """What every part gets: the options, the clock, and where results go.

    Attributes:
        output: The output folder. data_root: Where the synthetic data is generated.
        dry_run: CPU, tiny. budget_s: Seconds the whole check may take. started: When it
        started (``time.monotonic``). results: Part key -> its raw result (``device.json``).
    """

    output: Path
    data_root: Path
    dry_run: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    results: dict[str, Any] = field(default_factory=dict)

    def left_s(self) -> float:
        """Seconds of the budget left."""
        return self.budget_s - (time.monotonic() - self.started)


@dataclass(frozen=True)
class DevicePart:
    """One check of the device run.

    Attributes:
        key: Short name (``a``, ``b``; the table's first column), unique.
        title: One line.
        run: Runs the part; returns its table rows (its raw result goes to ``run.results``).
        estimate_s: Seconds it takes on the lent machine (skipped when less is left).
        needs_gpu: Skipped (and said so) without CUDA, unless a dry run.
    """

    key: str
    title: str
    run: Callable[[DeviceRun], list[Row]]
    estimate_s: float
    needs_gpu: bool = False


#: The parts, in the order they run.
PARTS: list[DevicePart] = []


def register_part(part: DevicePart) -> DevicePart:
    """Add a part to the device check (after those already there).

    Raises:
        ValueError: A part with that key is registered already.
    """
    if any(p.key == part.key for p in PARTS):
        raise ValueError(f"a device part {part.key!r} is registered already; pick another key")
    PARTS.append(part)
    return part


def _scenario_run(run: DeviceRun, name: str, words: Sequence[str], scenario: Any = None) -> Any:
    """``run_scenario`` of ``name`` with these command-line words (validated as the suite's)."""
    from benchmarks.arguments import add_arguments
    from benchmarks.runner import run_scenario

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            name,
            "--output",
            str(run.output / f"part-{name}"),
            "--data-root",
            str(run.data_root),
            *words,
        ]
    )
    result = run_scenario(name, args, scenario=scenario)
    result["summary"]["table"] = _scenario_table(result)
    return result


def _scenario_table(result: dict[str, Any]) -> str:
    from benchmarks.report import format_table

    try:
        return format_table(result)
    except Exception as exc:  # noqa: BLE001 - the device table is what matters; keep going
        return f"(table not rendered: {exc})"


_TINY = [
    "--samples-per-class",
    "10",
    "--batch",
    "16",
    "--width",
    "4",
    "--epochs",
    "2",
    "--max-steps",
    "5",
    "--eval-every",
    "0",
    "--repeats",
    "1",
    "--no-warmup",
    "--alone-steps",
    "1",
]


def _figure(result: dict[str, Any], contender: str, key: str = "samples_per_s") -> float:
    row = result["summary"]["contenders"].get(contender, {})
    value = row.get(key)
    return float(value) if value is not None else math.nan


def _cpu_gpu(run: DeviceRun) -> list[Row]:
    """Parts a and c: cpu-gpu's defaults vs the GPU alone, exact vs ghost BatchNorm."""
    from benchmarks.scenarios import DEFAULTS, SCENARIOS

    ghost = "hetero-ghost8" if run.dry_run else "hetero-ghost32"
    contenders = f"{DEFAULTS},gpu-alone,{ghost}"
    scenario = SCENARIOS["cpu-gpu"]
    if run.dry_run:
        stand_in = {"name": "gpu", "count": 1, "resources": {"CPU": 1}, "device": "cpu"}
        cpu = {"name": "cpu", "count": 1, "resources": {"CPU": 1}, "device": "cpu"}
        scenario = replace(
            scenario,
            workers=(stand_in, cpu),
            needs_gpu=False,
            defaults={**scenario.defaults, "gpu_stand_ins": ["gpu"]},
        )
        words = [*_TINY, "--contenders", contenders]
    else:
        words = [
            "--repeats",
            "1",
            "--epochs",
            "8",
            "--eval-every",
            "8",
            "--gpu-loader-workers",
            "2",
            "--contenders",
            contenders,
        ]
    result = _scenario_run(run, "cpu-gpu", words, scenario)
    run.results["a+c"] = result
    defaults, alone = _figure(result, DEFAULTS), _figure(result, "gpu-alone")
    exact, ghosted = defaults, _figure(result, ghost)
    ratio = defaults / alone if alone > 0 else math.nan
    acc = {c: _figure(result, c, "final_accuracy") for c in (DEFAULTS, "gpu-alone", ghost)}
    slices = {f["contender"]: f["figures"].get("slices") for f in result["fits"] if f["counted"]}
    return [
        Row(
            "a",
            "cpu-gpu: the defaults vs the GPU alone",
            DEFAULTS,
            defaults,
            "gpu-alone",
            ratio,
            ">= 1.0",
            bool(ratio >= 1.0),
            f"final acc {acc[DEFAULTS]:.3f}; slices {slices.get(DEFAULTS)}",
        ),
        Row(
            "a",
            "",
            "gpu-alone",
            alone,
            note=f"final acc {acc['gpu-alone']:.3f}",
        ),
        Row(
            "c",
            "exact vs ghost BatchNorm on the GPU (cpu-gpu)",
            ghost,
            ghosted,
            f"{DEFAULTS} (exact)",
            ghosted / exact if exact > 0 else math.nan,
            note=f"final acc {acc[ghost]:.3f} vs exact {acc[DEFAULTS]:.3f}; "
            f"slices {slices.get(ghost)}",
        ),
    ]


def _cpu_real(run: DeviceRun) -> list[Row]:
    """Part b: real heterogeneous CPU workers, pinned, vs stock and the ideal."""
    from benchmarks.scenarios import DEFAULTS, SCENARIOS

    scenario = SCENARIOS["cpu-real3"]
    if run.dry_run:
        from benchmarks.pinning import usable_cpus

        big = {"name": "big", "count": 1, "resources": {"CPU": 1}, "device": "cpu"}
        small = {"name": "small", "count": 1, "resources": {"CPU": 1}, "device": "cpu"}
        scenario = replace(
            scenario,
            workers=(big, small),
            needs_cpus=None,
            pin=len(usable_cpus()) >= 2,  # a core each, none kept for Ray: a dry run
            defaults={**scenario.defaults, "pin_reserved": 0},
        )
        words = [*_TINY]
    else:
        words = []
    result = _scenario_run(run, "cpu-real3", words, scenario)
    run.results["b"] = result
    stock, defaults = _figure(result, "stock"), _figure(result, DEFAULTS)
    ideal = _figure(result, DEFAULTS, "ideal_samples_per_s")
    efficiency = _figure(result, DEFAULTS, "efficiency")
    cores = result.get("cpu_sets") or {}
    pinned = ", ".join(f"{k}: {len(v)}" for k, v in cores.items()) or "not pinned"
    return [
        Row(
            "b",
            f"real CPU workers ({pinned} cores), no emulation",
            DEFAULTS,
            defaults,
            "stock",
            defaults / stock if stock > 0 else math.nan,
            note=f"efficiency {efficiency:.3f} of the ideal",
        ),
        Row("b", "", "stock", stock),
        Row(
            "b",
            "",
            "ideal",
            ideal,
            DEFAULTS,
            defaults / ideal if ideal > 0 else math.nan,
            ">= 0.9",
            bool(efficiency >= 0.9),
            "B / sum of each worker's samples/s alone at its slice",
        ),
    ]


register_part(
    DevicePart(
        "a+c",
        "cpu-gpu: defaults vs GPU alone; exact vs ghost BatchNorm",
        _cpu_gpu,
        estimate_s=300.0,
        needs_gpu=True,
    )
)
register_part(DevicePart("b", "cpu-real3: 8/4/2 pinned CPU workers", _cpu_real, 130.0))


def format_device_table(rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    """The one table the device check prints."""

    def num(value: float, fmt: str) -> str:
        return format(value, fmt) if math.isfinite(value) else "-"

    header = ("part", "check", "contender", "samples/s", "vs", "ratio", "goal")
    body = [
        (
            r.part,
            r.check,
            r.contender,
            num(r.samples_per_s, ".1f"),
            r.reference,
            num(r.ratio, ".2f"),
            f"{r.goal} {'met' if r.met else 'NOT met'}" if r.goal else "",
        )
        for r in rows
    ]
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for b, r in zip(body, rows):
        line = "  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip()
        lines.append(line + (f"   ({r.note})" if r.note else ""))
    return "\n".join([*lines, *(f"note: {n}" for n in notes)])


def _write(run: DeviceRun, rows: Sequence[Row], notes: Sequence[str], command: str) -> None:
    from benchmarks.contenders import machine_description
    from benchmarks.report import _json_default
    from raytrain_hetero.atomic import atomic_write_text

    run.output.mkdir(parents=True, exist_ok=True)
    table = format_device_table(rows, notes)
    payload = {
        "command": command,
        "dry_run": run.dry_run,
        "elapsed_s": time.monotonic() - run.started,
        "machine": machine_description(),
        "rows": [r.__dict__ for r in rows],
        "notes": list(notes),
        "parts": run.results,
    }
    atomic_write_text(run.output / "table.txt", table + "\n")
    atomic_write_text(
        run.output / "device.json", json.dumps(payload, indent=2, default=_json_default)
    )
    atomic_write_text(run.output / "COMMAND", command + "\n")


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPU
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks device --output DIR [--dry-run] [--budget-s S] [--parts K,...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks device", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output", type=Path, required=True, help="folder for the results")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny: checks the plumbing")
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="seconds the whole check may take"
    )
    parser.add_argument("--parts", default=None, help="comma-separated part keys (default all)")
    parser.add_argument(
        "--data-root", type=Path, default=Path("data/bench"), help="synthetic data cache"
    )
    args = parser.parse_args(list(sys.argv[2:] if argv is None else argv))
    for module in PART_MODULES:
        importlib.import_module(module)
    wanted = None if args.parts is None else {k.strip() for k in args.parts.split(",")}
    unknown = sorted((wanted or set()) - {p.key for p in PARTS})
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {[p.key for p in PARTS]}")
    command = shlex.join(["python", "-m", "benchmarks", "device", *(argv or sys.argv[2:])])
    run = DeviceRun(args.output, args.data_root, args.dry_run, args.budget_s)
    rows: list[Row] = []
    notes: list[str] = []
    failed = False
    for part in PARTS:
        if wanted is not None and part.key not in wanted:
            continue
        if part.needs_gpu and not run.dry_run and not _cuda():
            notes.append(f"part {part.key} skipped: it needs CUDA and torch sees none")
            continue
        if not run.dry_run and part.estimate_s > run.left_s():
            notes.append(
                f"part {part.key} skipped: it needs ~{part.estimate_s:.0f} s and "
                f"{run.left_s():.0f} s of the budget are left"
            )
            continue
        began = time.monotonic()
        print(f"device part {part.key}: {part.title}", flush=True)
        try:
            rows += part.run(run)
        except Exception as exc:  # noqa: BLE001 - report it in the table, run the next part
            failed = True
            traceback.print_exc()
            notes.append(f"part {part.key} failed: {type(exc).__name__}: {exc}")
        notes.append(f"part {part.key} took {time.monotonic() - began:.0f} s")
        _write(run, rows, notes, command)
    _write(run, rows, notes, command)
    print(format_device_table(rows, notes))
    print(f"\nwrote {run.output / 'table.txt'}, {run.output / 'device.json'}")
    return 1 if failed else 0
