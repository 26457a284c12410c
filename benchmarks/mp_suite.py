"""``python -m benchmarks conv-split`` and ``python -m benchmarks branches``.

Model parallelism measured against data parallelism on Ray Train workers (one
:class:`~raytrain_hetero.driver.trainer.HeteroTrainer` fit per worker configuration, every
contender alternating inside it over the same data and steps; see
:mod:`~benchmarks.mp_conv_loop` and :mod:`~benchmarks.mp_branch_loop`).
Figures: :mod:`~benchmarks.mp_analysis`. Outputs in ``--output``: ``bench.json``
(raw and derived figures, options, machine), ``results.md`` (the tables and target
verdicts), ``COMMAND`` and, for conv-split, ``conv_split.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.scenarios import BRANCH_CONFIGS, CONV_CONFIGS, MP_SCENARIOS
from raytrain_hetero.atomic import atomic_write_text

__all__ = ["format_markdown", "mp_options", "run_model_parallel"]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def mp_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The scenario's full or quick options with those given on the command line."""
    options = dict(MP_SCENARIOS[name]["quick" if args.quick else "full"])
    if args.width is not None:
        options["width"] = args.width
    if args.batches:
        options["batches"] = _ints(args.batches)
        if "sweep_batch" in options:  # never sweep at a batch larger than any measured
            options["sweep_batch"] = min(options["sweep_batch"], max(options["batches"]))
    if args.batch is not None:
        options["batch"] = args.batch
        options.setdefault("batches", [args.batch])
    if args.epochs is not None:
        options["epochs"] = args.epochs
    if args.steps is not None:
        options["steps"] = args.steps
    if args.rounds is not None:
        options["rounds"] = args.rounds
    if args.delays:
        options["delays"] = [] if args.delays == "none" else _floats(args.delays)
    if args.configs:
        options["configs"] = [c.strip() for c in args.configs.split(",") if c.strip()]
    known = CONV_CONFIGS if name == "conv-split" else BRANCH_CONFIGS
    unknown = [c for c in options["configs"] if c not in known]
    if unknown:
        raise ValueError(f"unknown --configs {unknown}; choose from {sorted(known)}")
    if args.contenders:
        options["contenders"] = [c.strip() for c in args.contenders.split(",") if c.strip()]
    else:
        options["contenders"] = ["alone", "equal", "proportional", "data"]
    options["quick"] = bool(args.quick)
    return options


def _fit(loop: Any, config: dict[str, Any], factors: tuple[float, ...], storage: Path) -> None:
    from ray.train import RunConfig

    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.driver.trainer import HeteroTrainer

    trainer = HeteroTrainer(
        loop,
        train_loop_config=config,
        workers=[WorkerSpec(name=f"w{i}", emulated_slowdown=f) for i, f in enumerate(factors)],
        batch={"global_batch_size": 32},
        run_config=RunConfig(name=f"mp-bench-{uuid.uuid4().hex[:8]}", storage_path=str(storage)),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error


def _run_conv_split(options: dict[str, Any], scratch: Path) -> list[dict[str, Any]]:
    from benchmarks.mp_analysis import conv_split_figures
    from benchmarks.mp_conv_loop import conv_split_bench_loop

    configs = []
    for label in options["configs"]:
        out = scratch / label
        loop_config = {
            "width": options["width"],
            "batches": options["batches"],
            "samples": max(options["batches"] + [options["sweep_batch"]]) * 2,
            "steps": options["steps"],
            "rounds": options["rounds"],
            "lr": options["lr"],
            "contenders": options["contenders"],
            "delays_ms_per_mb": options["delays"] if label == options["configs"][0] else [],
            "sweep_batch": options["sweep_batch"],
            "out": str(out),
        }
        started = time.time()
        _fit(conv_split_bench_loop, loop_config, CONV_CONFIGS[label], scratch / "ray")
        raw = json.loads((out / "conv_split.json").read_text())
        figures = conv_split_figures(raw)
        configs.append(
            {"label": label, "raw": raw, "figures": figures, "wall_s": time.time() - started}
        )
        print(f"conv-split {label}: done in {time.time() - started:.0f} s", flush=True)
    return configs


def _run_branches(options: dict[str, Any], scratch: Path) -> list[dict[str, Any]]:
    from benchmarks.mp_branch_loop import branches_bench_loop

    configs = []
    for label in options["configs"]:
        out = scratch / label
        loop_config = {k: options[k] for k in MP_SCENARIOS["branches"]["full"] if k != "configs"}
        loop_config["out"] = str(out)
        started = time.time()
        _fit(branches_bench_loop, loop_config, BRANCH_CONFIGS[label], scratch / "ray")
        raw = json.loads((out / "branches.json").read_text())
        configs.append({"label": label, "raw": raw, "wall_s": time.time() - started})
        print(f"branches {label}: done in {time.time() - started:.0f} s", flush=True)
    return configs


def _num(value: Any, fmt: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, fmt)


def _targets_md(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["", "### Targets", ""]
    for t in targets:
        where = ""
        if "at_paper_shapes" in t and not t["at_paper_shapes"]:
            where = " (scaled-down width, NOT the paper's shapes)"
        batch = f", batch {t['batch']}" if "batch" in t else ""
        lines.append(
            f"- {t['target']}: {t['config']}{batch}: {_num(t['figure'])} -> "
            f"{'met' if t['met'] else 'NOT MET'}{where}"
        )
    return lines


def _conv_markdown(result: dict[str, Any]) -> list[str]:
    lines = []
    for config in result["configs"]:
        fig = config["figures"]
        speeds = ", ".join(f"1/{f:g}" if f != 1 else "1" for f in fig["factors"])
        lines += [
            "",
            f"### {config['label']}: {len(fig['factors'])} workers, EMULATED speeds "
            f"({speeds}); ideal speed-up {fig['ideal_speedup']:.2f}",
            "",
            "| batch | contender | step s | conv s | speed-up | conv speed-up | efficiency "
            "| conv efficiency | bytes/step | kernels conv1 / conv2 or slices |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in fig["rows"]:
            split = (
                f"{r['kernels'].get('conv1')} / {r['kernels'].get('conv2')}"
                if r["kernels"]
                else (f"slices {r['slices']}" if r["slices"] else "-")
            )
            lines.append(
                f"| {r['batch']} | {r['contender']} | {_num(r['step_s'], '.3f')} | "
                f"{_num(r['conv_s'], '.3f')} | {_num(r['speedup'])} | "
                f"{_num(r['conv_speedup'])} | {_num(r['efficiency'])} | "
                f"{_num(r['conv_efficiency'])} | {r['bytes_per_step']:,} | {split} |"
            )
        if fig["proportional_over_equal"]:
            ratios = ", ".join(
                f"batch {r['batch']}: {_num(r['step'])}x (conv {_num(r['conv'])}x)"
                for r in fig["proportional_over_equal"]
            )
            lines += ["", f"Proportional over equal split: {ratios}."]
        if fig["sweep"]:
            lines += [
                "",
                f"Bandwidth sweep at batch {fig['sweep'][0]['batch']} (EMULATED link: sleep "
                "delay x bytes after each collective):",
                "",
                "| delay ms/MB | proportional split s | data parallel s | split bytes/step "
                "| data bytes/step |",
                "|---:|---:|---:|---:|---:|",
            ]
            for e in fig["sweep"]:
                lines.append(
                    f"| {e['delay_ms_per_mb']:g} | {_num(e['proportional_s'], '.3f')} | "
                    f"{_num(e['data_s'], '.3f')} | {e['proportional_bytes']:,} | "
                    f"{e['data_bytes']:,} |"
                )
            measured = fig["crossover_ms_per_mb_measured"]
            predicted = fig["crossover_ms_per_mb_predicted"]
            lines += [
                "",
                "Crossover (data parallelism wins from): measured "
                + (f"{measured:g} ms/MB" if measured is not None else "none in the sweep")
                + (" (data parallelism already wins on the free link)" if measured == 0.0 else "")
                + "; predicted from the free-link times and bytes: "
                + (
                    f"{predicted:.3g} ms/MB (below {1000 / predicted:.3g} MB/s per worker)"
                    if predicted
                    else "none (no positive crossover)"
                )
                + ".",
            ]
    return lines


def _branches_markdown(result: dict[str, Any]) -> list[str]:
    lines = []
    for config in result["configs"]:
        raw = config["raw"]
        place = raw["placement"]
        lines += [
            "",
            f"### {config['label']}: {raw['world']} workers, EMULATED slowdowns "
            f"{raw['factors']}; placement {place['branch_ranks']}, head on rank "
            f"{place['head_rank']}; data-parallel slices {raw['data_slices']}",
            "",
            "| contender | step s | samples/s | bytes/step (branches: send counters; data: "
            "ring formula) | bytes/step predicted | val accuracy | inference ms/sample |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, c in raw["contenders"].items():
            lines.append(
                f"| {name} | {_num(c['step_s'], '.3f')} | {_num(c['samples_per_s'], '.1f')} | "
                f"{int(c['bytes_per_step']):,} | {int(c['predicted_bytes_per_step']):,} | "
                f"{_num(c['val_accuracy'], '.3f')} | "
                f"{_num(1e3 * c['inference_s_per_sample'], '.3f')} |"
            )
    return lines


def format_markdown(result: dict[str, Any]) -> str:
    """The results as markdown: what was measured where, the tables, the target verdicts."""
    o = result["options"]
    m = result["machine"]
    lines = [
        f"## python -m benchmarks {result['scenario']}",
        "",
        result["description"] + ".",
        "",
        f"Measured on {m.get('cpu_model')} ({m.get('usable_cpus')} usable cores, shared), "
        f"torch {m.get('torch')}, ray {m.get('ray')}, one torch thread per worker; "
        f"heterogeneity is EMULATED (process-CPU-time stretching). GPUs: {m.get('gpus') or 'none'}.",
        f"Command: `{result['command']}`",
        "",
        result["note"],
    ]
    if result["scenario"] == "conv-split":
        lines.append(
            f"Shapes measured: width {o['width']} (conv1 {o['width']} kernels, conv2 "
            f"{3 * o['width']}; the paper's network is width 500), batches {o['batches']}, "
            f"{o['steps']} timed steps x {o['rounds']} rounds per contender (A B C D, D C B A)."
        )
        lines += _conv_markdown(result)
    else:
        lines += _branches_markdown(result)
    lines += _targets_md(result["targets"])
    return "\n".join(lines) + "\n"


def _note(name: str, options: dict[str, Any]) -> str:
    if name == "conv-split":
        scaled = options["width"] < 500
        return (
            "EMULATION: worker speeds are emulated on a shared CPU machine; "
            + (
                f"the network is scaled down to width {options['width']} (the paper's 500/1500 "
                "kernels take minutes per step on one CPU thread), so the paper-shape target is "
                "NOT measured here. "
                if scaled
                else "measured at the paper's shapes (width 500: conv 500 -> 1500 kernels). "
            )
            + "No GPU was available: the GPU + CPU run of the paper was not made."
        )
    return (
        "EMULATION: worker speeds are emulated on a shared CPU machine. With 3 workers the "
        "2 branches go to 2 workers and the fusion head alone to the third."
    )


def run_model_parallel(args: argparse.Namespace) -> int:
    """Run (or ``--render-only`` re-render) a model-parallel scenario; print; write outputs."""
    from benchmarks.arguments import command_line
    from benchmarks.mp_analysis import branches_targets, conv_split_targets

    name = args.scenario
    output = args.output or Path("outputs/bench") / name
    if args.render_only:
        result = json.loads((output / "bench.json").read_text())
    else:
        try:
            options = mp_options(name, args)
        except ValueError as exc:
            print(f"python -m benchmarks: error: {exc}", file=sys.stderr)
            return 2
        import ray

        from benchmarks.contenders import machine_description
        from raytrain_hetero.driver.session import init_ray

        known = CONV_CONFIGS if name == "conv-split" else BRANCH_CONFIGS
        result = {
            "scenario": name,
            "description": MP_SCENARIOS[name]["description"],
            "emulated": True,
            "command": command_line(args),
            "options": options,
            "machine": machine_description(),
        }
        scratch = Path(tempfile.mkdtemp(prefix=f"rh-bench-{name}-"))
        started = time.time()
        if ray.is_initialized():
            ray.shutdown()
        init_ray(num_cpus=max(len(known[c]) for c in options["configs"]) + 1)
        try:
            run = _run_conv_split if name == "conv-split" else _run_branches
            result["configs"] = run(options, scratch)
        finally:
            ray.shutdown()
            shutil.rmtree(scratch, ignore_errors=True)
        result["elapsed_s"] = time.time() - started
    result["note"] = _note(name, result["options"])
    if name == "conv-split":
        result["targets"] = conv_split_targets(
            [{"label": c["label"], **c["figures"]} for c in result["configs"]]
        )
    else:
        result["targets"] = branches_targets([c["raw"] for c in result["configs"]])
    text = format_markdown(result)
    print(text)
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / "bench.json", json.dumps(result, indent=2, allow_nan=True))
    atomic_write_text(output / "results.md", text)
    atomic_write_text(output / "COMMAND", result["command"] + "\n")
    if name == "conv-split":
        from benchmarks.plots import plot_conv_split

        plot_conv_split(result, output / "conv_split.png")
    return 0
