"""A spot preemption with notice: the library's hand-off against Ray Train's documented reaction.

One local multi-node Ray cluster (``ray.cluster_utils.Cluster``); per fit, a fresh pool of two
nodes: one of 2 CPUs (ranks 0 and 1) and one of 1 CPU (rank 2), the spot node. Three workers,
``min_workers=2``, the ledger loop of ``tests/integration/train_loops.py`` (one epoch; a
periodic checkpoint every ``--checkpoint-every`` steps). After ``--drain-after`` steps on three
workers the spot node is drained through Ray's drain API (reason PREEMPTION, a deadline
``--notice`` seconds ahead) and removed at the deadline. Contenders, alternating:

* ``hetero``: the library's default (``ElasticConfig.preemption_notice``): every rank trains to
  the last step that fits, the loop checkpoints when ``checkpoint_due()``, the group continues
  at once on two workers;
* ``ray-docs``: the notice off in the library; the loop reads ``ray.train.get_preemption_info()``
  every step and checkpoints at the first notice, as Ray's docs write it; Ray Train's
  controller waits out the deadline and restarts from the newest checkpoint;
* ``reference``: no drain (three workers throughout): the final parameters each contender's
  are compared with (max absolute difference; the soak's float32 bound is 1e-4).

Figures per fit, from the workers' ledgers and step records: steps trained twice (global steps
run by more than one worker group), seconds idle (from the end of the last step whose update
survived to the first step of the two-worker group: the wall time the run made no kept
progress) and the first two-worker step relative to the deadline. Timings on a shared 2-core
machine are load-sensitive: repeat, and read the spread.

    python -m benchmarks.preemption --output benchmarks/results/preemption
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "tests" / "integration"

__all__ = ["main", "preemption_figures"]


def preemption_figures(entries: list[dict], records: list[Any], deadline: float) -> dict:
    """Steps trained twice, seconds idle and the restart's lag past the deadline of one fit.

    Args:
        entries: Every rank's ledger entries (``step``, ``group``, ``world``).
        records: The fit's step records (``HeteroTrainer.step_records``).
        deadline: The drain's deadline (UNIX seconds).
    """
    groups_by_step: dict[int, set[str]] = defaultdict(set)
    for entry in entries:
        groups_by_step[entry["step"]].add(entry["group"])
    twice = sum(1 for groups in groups_by_step.values() if len(groups) > 1)
    two = [r for r in records if r.world_size == 2]
    three = [r for r in records if r.world_size == 3]
    first_two = min(r.time - r.wall_s for r in two)
    resumed_at = min(r.step for r in two)
    # The last step whose update survived: the one before the two-worker group's first.
    kept = [r.time for r in three if r.step == resumed_at - 1]
    kept_end = max(kept) if kept else float("nan")
    return {
        "steps_trained_twice": twice,
        "seconds_idle": first_two - kept_end,
        "first_step_after_deadline_s": first_two - deadline,
        "last_three_worker_step_before_deadline_s": deadline - max(r.time for r in three),
        "steps_at_three_workers": len({r.step for r in three}),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notice", type=float, default=20.0, help="seconds of notice")
    parser.add_argument("--drain-after", type=int, default=10, help="steps at 3 workers first")
    parser.add_argument("--size", type=int, default=14400, help="samples (B=48: 300 steps)")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=1, help="fits per contender (A B B A)")
    parser.add_argument("--output", type=Path, default=None)
    return parser.parse_args(argv)


def _fit(cluster: Any, contender: str, index: int, args: argparse.Namespace, base: Path) -> dict:
    from ledgers import _read_jsonl
    from ray.train import FailureConfig, RunConfig
    from train_loops import live_loop

    from raytrain_hetero import BatchConfig, ElasticConfig, HeteroTrainer, WorkerSpec
    from raytrain_hetero.driver._ray_compat import drain_node_for_preemption

    label = f"{contender}{index}"
    kept = cluster.add_node(num_cpus=2, labels={"pool": label})
    spot = cluster.add_node(num_cpus=1, labels={"pool": label})
    cluster.wait_for_nodes()
    out = base / label
    out.mkdir(parents=True)
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={
            "size": args.size,
            "epochs": 1,
            "out": str(out),
            "checkpoint_every": args.checkpoint_every,
            "step_sleep_s": args.step_sleep,
            "ray_docs_preemption": contender == "ray-docs",
        },
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": label})],
        batch=BatchConfig(global_batch_size=48),
        elastic=ElasticConfig(
            min_workers=2,
            resize_monitor_interval_s=1.0,
            preemption_notice=contender == "hetero",
        ),
        run_config=RunConfig(
            name=label,
            storage_path=str(base / "results"),
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    deadline: list[float] = []

    def remove_at_deadline() -> None:
        time.sleep(max(0.0, deadline[0] - time.time()))
        if spot in cluster.worker_nodes:
            cluster.remove_node(spot)

    def progress(update: Any) -> None:
        steps = {r.step for r in trainer.step_records if r.world_size == 3}
        if contender != "reference" and not deadline and len(steps) >= args.drain_after:
            deadline.append(drain_node_for_preemption(cluster.address, spot.node_id, args.notice))
            threading.Thread(target=remove_at_deadline, daemon=True).start()

    started = time.time()
    result = trainer.fit(progress=progress, poll_interval_s=0.5)
    wall = time.time() - started
    if result.error is not None or (contender != "reference" and not deadline):
        raise RuntimeError(f"{label}: fit failed or no drain ({result.error})")
    figures: dict[str, Any] = {}
    if contender != "reference":
        entries = [e for path in out.glob("ledger_rank*_*.jsonl") for e in _read_jsonl(path)]
        figures = preemption_figures(entries, trainer.step_records, deadline[0])
    figures.update(contender=contender, fit_s=wall, params=str(out / "final_params.npy"))
    for node in (kept, spot):
        if node in cluster.worker_nodes:
            cluster.remove_node(node)
    print(json.dumps(figures), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"
    os.environ.setdefault("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "0.5")
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "8")
    sys.path[:0] = [str(LOOPS), str(ROOT)]
    import ray
    from ray.cluster_utils import Cluster
    from ray_env import FAST_NODE_DEATH

    pythonpath = os.pathsep.join([str(LOOPS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "_system_config": FAST_NODE_DEATH},
    )
    ray.init(
        address=cluster.address,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": pythonpath, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
        },
    )
    order = []
    for repeat in range(args.repeats):
        pair = ["hetero", "ray-docs"] if repeat % 2 == 0 else ["ray-docs", "hetero"]
        order.extend(["reference", *pair])
    base = Path(tempfile.mkdtemp(prefix="raytrain_hetero_preemption_"))
    fits = []
    try:
        for index, contender in enumerate(order):
            fits.append(_fit(cluster, contender, index, args, base))
    finally:
        ray.shutdown()
        cluster.shutdown()
    from ledgers import max_param_diff

    for index, fit in enumerate(fits):
        if fit["contender"] != "reference":
            reference = next(f for f in reversed(fits[:index]) if f["contender"] == "reference")
            fit["max_param_diff_vs_reference"] = max_param_diff(
                Path(fit["params"]), Path(reference["params"])
            )
    summary = {}
    for contender in ("hetero", "ray-docs"):
        mine = [f for f in fits if f["contender"] == contender]
        summary[contender] = {
            key: statistics.median(f[key] for f in mine)
            for key in (
                "steps_trained_twice",
                "seconds_idle",
                "first_step_after_deadline_s",
                "last_three_worker_step_before_deadline_s",
                "max_param_diff_vs_reference",
            )
        }
    print(json.dumps(summary, indent=1))
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "bench.json").write_text(
            json.dumps(
                {
                    "options": vars(args) | {"output": str(args.output)},
                    "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                    "fits": fits,
                    "median": summary,
                },
                indent=1,
            )
            + "\n"
        )
        (args.output / "COMMAND").write_text(
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 python -m benchmarks.preemption "
            + " ".join(argv if argv is not None else sys.argv[1:])
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
