"""Start-up A/B: a HeteroTrainer fit with and without Ray Train's per-group DatasetManager actor.

Ray Train 2.60 starts a DatasetManager actor with every worker group even when the trainer has
no datasets; ``driver/_ray_compat.without_idle_dataset_manager`` leaves it out. This times a
2-worker fit whose loop reports once (start-up and shutdown only), alternating the two forms
on one embedded local Ray, and prints the medians and their ratio (the first fit of each form
is a warm-up and not counted).

    flock /tmp/raytests.lock python -m benchmarks.dataset_manager_ab --fits 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def _loop(config: dict) -> None:
    import ray.train

    ray.train.report({"done": 1})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=4, help="fits per form (first is warm-up)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    import ray
    from ray.train import RunConfig

    import raytrain_hetero.driver.elastic as elastic
    from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    skip = elastic.without_idle_dataset_manager
    forms = {"with DatasetManager (Ray's)": lambda callbacks, trainer: callbacks, "without": skip}
    times: dict[str, list[float]] = {name: [] for name in forms}
    storage = tempfile.mkdtemp(prefix="dm_ab_")
    for i in range(args.fits * len(forms)):
        name = list(forms)[i % len(forms)]
        elastic.without_idle_dataset_manager = forms[name]  # type: ignore[assignment]
        started = time.perf_counter()
        HeteroTrainer(
            _loop,
            workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
            batch=BatchConfig(global_batch_size=8),
            run_config=RunConfig(name=f"ab{i}", storage_path=storage),
        ).fit()
        times[name].append(time.perf_counter() - started)
        print(f"fit {i:2d} {name:<28} {times[name][-1]:6.2f} s", flush=True)
    elastic.without_idle_dataset_manager = skip
    ray.shutdown()
    medians = {name: statistics.median(t[1:] or t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"{name:<28} median {median:6.2f} s  all {[round(t, 1) for t in times[name]]}")
    with_s, without_s = medians.values()
    print(f"fit wall without / with: {without_s / with_s:.2f}")


if __name__ == "__main__":
    main()
