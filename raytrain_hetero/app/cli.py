"""Command line: ``raytrain-hetero train|probe|tune|predict|bench --config FILE``, ``sim``
and ``rent FILE``.

Errors the user can fix (configuration, data, placement) print one clear message and exit
with status 2; nothing half-written is left in the output directory.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raytrain_hetero.errors import HeteroError

logger = logging.getLogger(__name__)

_OVERWRITE_HELP = (
    "write into a non-empty output directory, replacing the files this command writes "
    "(nothing else there is deleted); without it a non-empty one is refused"
)


def _path_or_uri(value: str) -> Path | str:
    """An ``--output`` / ``--checkpoint``: a URI (``s3://bucket/out``) stays as written,
    anything else is a local path."""
    from raytrain_hetero.storage import is_uri

    return value if is_uri(value) else Path(value)


def _job_command(
    sub: Any,
    name: str,
    help: str,
    *,
    config_help: str = "job config YAML",
    set_example: str = "",
    output_help: str | None = None,
    overwrite_help: str | None = _OVERWRITE_HELP,
) -> argparse.ArgumentParser:
    """A subcommand taking a job: the config (positional or ``--config``), repeatable
    ``--set KEY=VALUE`` overrides and, where given, ``--output`` and ``--overwrite``."""
    command: argparse.ArgumentParser = sub.add_parser(name, help=help)
    command.add_argument("config_path", nargs="?", type=Path, help=config_help)
    command.add_argument("--config", dest="config_flag", type=Path, help=config_help)
    if output_help is not None:
        command.add_argument("--output", type=_path_or_uri, default=None, help=output_help)
    example = f", e.g. --set {set_example}" if set_example else ""
    command.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key{example} (repeatable)",
    )
    if output_help is not None and overwrite_help is not None:
        command.add_argument("--overwrite", action="store_true", help=overwrite_help)
    return command


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``raytrain-hetero``."""
    parser = argparse.ArgumentParser(
        prog="raytrain-hetero",
        description="Heterogeneity-aware, exact data-parallel training on Ray Train V2.",
    )
    parser.add_argument(
        "--log-level", default="WARNING", help="Python log level (default WARNING)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    default_output = "output directory (default: output_dir from the config)"

    train = _job_command(
        sub,
        "train",
        "train a model from a YAML job config",
        set_example="train.epochs=1",
        output_help=default_output,
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar or table")
    train.add_argument(
        "--run-name",
        default=None,
        help="Ray Train run name, the run's identity in its storage (default: "
        "<name>-<time>-<random>, unique); with --resume, the run to continue",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run --run-name from its last checkpoint (same storage)",
    )
    _job_command(
        sub, "probe", "measure the workers a config would start; print their speeds and the plan"
    )
    tune = _job_command(
        sub,
        "tune",
        "hyperparameter search (Ray Tune, ASHA) over the config's tune: section",
        config_help="job config YAML with tune:",
        set_example="tune.num_samples=2",
        output_help=default_output,
    )
    tune.add_argument("--quiet", action="store_true", help="no Tune progress tables")

    predict = _job_command(
        sub,
        "predict",
        "distributed inference with a trained checkpoint (Ray Data actor pools, batch "
        "sizes proportional to measured actor speed)",
        output_help="output directory (default: <output_dir>/predict)",
    )
    predict.add_argument(
        "--checkpoint",
        type=_path_or_uri,
        required=True,
        help="model.pt, a checkpoint directory, or a run/output directory; a local path or "
        "a URI (s3://bucket/runs/NAME)",
    )
    predict.add_argument(
        "--split",
        default=None,
        help="train, val or test (default test); scene: every pixel of a "
        "hyperspectral scene (its default)",
    )
    predict.add_argument(
        "--mode",
        choices=("proportional", "equal", "single"),
        default="proportional",
        help="proportional: per-pool batch and share by measured speed "
        "(default); equal: same for every actor; single: one actor",
    )
    predict.add_argument(
        "--batch-size", type=int, default=128, help="batch size of the fastest actor (default 128)"
    )
    bench = _job_command(
        sub,
        "bench",
        "compare stock Ray Train (TorchTrainer, DDP, equal split) with raytrain_hetero "
        "on this job and cluster: start-up, samples/s, wall time, final accuracy",
        set_example="train.epochs=1",
        output_help="directory for bench.json (default: <output_dir>/bench)",
        overwrite_help="replace a bench.json already in --output",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="fits per contender, alternating; the table shows medians (default 1)",
    )

    from raytrain_hetero.sim.simulator import add_arguments as add_sim_arguments

    add_sim_arguments(
        sub.add_parser(
            "sim", help="large-cluster simulator of the allocation and re-planning policy"
        )
    )
    from raytrain_hetero.app.rent_job import add_arguments as add_rent_arguments

    add_rent_arguments(
        sub.add_parser(
            "rent", help="the instance mix to rent for a deadline or budget; --apply rents it"
        )
    )
    return parser


def _load_job(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The job of a job command: its config file with the ``--set`` overrides merged."""
    from raytrain_hetero.app.config import load_config, parse_overrides

    path = args.config_flag or args.config_path
    if path is None:
        parser.error(
            f"{args.command} needs a config: raytrain-hetero {args.command} --config FILE.yaml"
        )
    if args.config_flag and args.config_path and args.config_flag != args.config_path:
        parser.error("give the config once, either positionally or with --config")
    return load_config(path, parse_overrides(args.overrides))


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the parsed command; its exit status."""
    if args.command == "sim":
        from raytrain_hetero.sim.simulator import run_from_args as run_sim

        return run_sim(args)
    if args.command == "rent":
        from raytrain_hetero.app.rent_job import run_from_args as run_rent

        return run_rent(args)
    job = _load_job(args, parser)
    if args.command == "train":
        from raytrain_hetero.app.job import run_job
        from raytrain_hetero.app.resolved import RunRequest, resolve_job

        # The job resolved once: outputs, data, model and layout checked, in that order.
        resolved = resolve_job(
            job, outputs=RunRequest(args.output, args.run_name, args.resume, args.overwrite)
        )
        if job.data.source == "ray_data" and job.probe.group == "auto":
            from raytrain_hetero.app.probe_job import probe_with_roles

            # One probe: its measured cost models decide the roles; feeders leave the group.
            resolved = resolved.with_roles(probe_with_roles(resolved)[1])
        run_job(resolved, progress=not args.no_progress)
    elif args.command == "probe":
        from raytrain_hetero.app.probe_job import run_probe

        run_probe(job)
    elif args.command == "tune":
        from raytrain_hetero.app.tune_job import format_best, run_tune

        summary = run_tune(
            job, output_dir=args.output, verbose=0 if args.quiet else 1, overwrite=args.overwrite
        )
        print(format_best(summary))
        print(
            f"trials: {summary['trials']} ({summary['failed_trials']} failed); "
            f"results: {job.ray.location(args.output or job.output_dir)}/trials.csv, trials.png"
        )
    elif args.command == "predict":
        from raytrain_hetero.app.predict import run_predict

        run_predict(
            job,
            args.checkpoint,
            output_dir=args.output,
            split=args.split,
            mode=args.mode,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
        )
    elif args.command == "bench":
        from raytrain_hetero.app.bench import run_bench

        run_bench(job, output_dir=args.output, repeats=args.repeats, overwrite=args.overwrite)
    return 0


def _report_error(exc: HeteroError) -> int:
    """Print ``exc`` as one line on stderr (several problems joined by ``;``); returns 2, the
    exit status of an error the user can fix."""
    lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
    message = " ".join([*lines[:1], "; ".join(lines[1:])] if len(lines) > 1 else lines)
    print(f"raytrain-hetero: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``raytrain-hetero`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # A Ray the caller started (a notebook, a script, a test session) is theirs to stop.
    ray_module = sys.modules.get("ray")
    callers_ray = ray_module is not None and ray_module.is_initialized()
    try:
        return _run(args, parser)
    except HeteroError as exc:
        return _report_error(exc)
    except KeyboardInterrupt:
        print("raytrain-hetero: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A worker's HeteroError arrives wrapped in Ray's errors (a traceback as message).
        from raytrain_hetero.driver._ray_compat import hetero_error_cause

        cause = hetero_error_cause(exc)
        if cause is None:
            raise
        logger.debug("run failed", exc_info=exc)
        return _report_error(cause)
    finally:
        import ray

        if ray.is_initialized() and not callers_ray:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
