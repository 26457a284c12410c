"""Distributed inference with the Python API: proportional actor pools vs the baselines.

Trains (briefly, through the main job) a 3-D CNN on a synthetic hyperspectral scene if no
checkpoint is given, then classifies every pixel of the scene three ways with Ray Data
``map_batches`` actor pools on two workers of emulated unequal speed -- per-pool batch sizes
and shares proportional to measured actor speed, equal batches and shares, and a single
actor -- and prints samples/s of each (the class map is written as a GeoTIFF)::

    python examples/predict_distributed.py           # ~3 min on 2 cores
    python examples/predict_distributed.py --config my_job.yaml --checkpoint outputs/my_job
"""

from __future__ import annotations

import argparse
from pathlib import Path

from raytrain_hetero.app.config import load_config
from raytrain_hetero.app.datasets import configured_bad_files
from raytrain_hetero.app.job import init_ray, run_job
from raytrain_hetero.app.predict import predictor_spec, run_predict
from raytrain_hetero.inference.checkpoints import find_checkpoint_file
from raytrain_hetero.inference.predict import measure_worker_speeds

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "hyperspectral_local.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    job = load_config(
        args.config,
        {
            "workers": [
                # EMULATION: the slow worker stretches its compute 3x.
                {"name": "fast", "resources": {"CPU": 1}, "emulated_slowdown": 1},
                {"name": "slow", "resources": {"CPU": 1}, "emulated_slowdown": 3},
            ],
            "train": {"epochs": 2},
        },
    )
    init_ray(job)
    if args.checkpoint is None:
        run_job(job, progress=False)
        args.checkpoint = Path(job.output_dir)
    checkpoint = find_checkpoint_file(args.checkpoint)
    split = "scene" if job.data.dataset == "hyperspectral" else "test"
    # Measure once and reuse the speeds, so the three runs differ only in the plan.
    spec = predictor_spec(job, checkpoint, split, configured_bad_files(job.data))
    speeds = measure_worker_speeds(spec, job.workers, args.batch_size)
    print("measured samples/s per actor:", dict(zip((w.name for w in job.workers), speeds)))
    for mode in ("proportional", "equal", "single"):
        summary = run_predict(
            job,
            checkpoint,
            mode=mode,
            batch_size=args.batch_size,
            speeds=speeds,
            output_dir=Path(job.output_dir) / f"predict-{mode}",
            quiet=True,
        )
        print(
            f"{mode:>12}: {summary['samples_per_s']:8.1f} samples/s end to end, "
            f"{summary['samples_per_s_compute_span']:8.1f} samples/s over the compute span; "
            f"plan {[(p['worker'], p['batch_size'], p['samples']) for p in summary['plan']]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
