"""The service path on real Ray: a worker's HeteroError reaches the user as its one line,
checkpoints are kept by score and by age, ``kill -9`` of a worker during
``raytrain-hetero train`` is survived, and ``--run-name ... --resume`` continues a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lean_job import LEAN_JOB
from network_sockets import descendants

from raytrain_hetero import HeteroTrainer, WorkerSpec
from raytrain_hetero.app.config import load_config
from raytrain_hetero.app.outputs import read_metrics_csv
from raytrain_hetero.app.runs import RunIdentity
from raytrain_hetero.config import BatchConfig
from raytrain_hetero.errors import DataError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"

pytestmark = pytest.mark.timeout(600)


# ------------------------------------------------------------------------------ one Ray session


def test_worker_data_error_comes_back_as_its_one_line(ray_local, run_config):
    from service_loops import data_error_loop

    from raytrain_hetero.driver._ray_compat import hetero_error_cause

    message = "/data/Forest_7.tif: truncated TIFF. Fix: regenerate or remove it"
    trainer = HeteroTrainer(
        data_error_loop,
        train_loop_config={"rank": 1, "message": message},
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
        batch=BatchConfig(global_batch_size=8, fixed_shares=(1.0, 1.0)),
        run_config=run_config,
    )
    try:
        result = trainer.fit()
        error: BaseException | None = result.error
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises is what the CLI sees
        error = exc
    assert error is not None and not isinstance(error, DataError)  # Ray's wrapper
    cause = hetero_error_cause(error)
    assert isinstance(cause, DataError) and str(cause) == message


def test_best_and_latest_checkpoints_survive(ray_local, tmp_path):
    from service_loops import scored_checkpoints_loop

    from raytrain_hetero.app.job import run_config

    job = load_config(EXAMPLE)
    run = RunIdentity("scored", tmp_path / "store")
    scores = [0.5, 0.9, 0.7, 0.8, 0.2]  # the last one is the worst
    trainer = HeteroTrainer(
        scored_checkpoints_loop,
        train_loop_config={"scores": scores},
        workers=[WorkerSpec(name="solo")],
        batch=BatchConfig(global_batch_size=4, fixed_shares=(1.0,)),
        run_config=run_config(job, run),
    )
    result = trainer.fit()
    assert result.error is None
    kept = sorted(
        int((d / "index.txt").read_text()) for d in run.folder.glob("checkpoint_*") if d.is_dir()
    )
    # num_to_keep=2 by val_accuracy (0.9 and 0.8) plus the latest, whatever its score.
    assert kept == [1, 3, 4]
    assert int(Path(result.checkpoint.path, "index.txt").read_text()) == 4


# ------------------------------------------------------------------------------ the CLI


def _train_workers(root: int) -> list[int]:
    pids = []
    for pid in descendants(root)[1:]:  # below the CLI process
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "RayTrainWorker" in cmdline:
            pids.append(pid)
    return sorted(pids)


def _cli(out: Path, *extra: str) -> list[str]:
    config = out.parent / "lean.yaml"
    if not config.exists():
        config.write_text(yaml.safe_dump(LEAN_JOB))
    return [
        sys.executable,
        "-m",
        "raytrain_hetero",
        "train",
        str(config),
        "--output",
        str(out),
        "--no-progress",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


def test_kill_9_of_a_worker_during_train_is_survived_and_resume_continues(
    tmp_path, monkeypatch, capsys
):
    from raytrain_hetero.app.cli import main

    out = tmp_path / "out"
    run_folder = out / "ray_results" / "nightly"
    args = _cli(
        out, "--run-name", "nightly", "--set", "train.epochs=2", "--set", "train.max_failures=1"
    )
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killed = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(run_folder.glob("checkpoint_*")):
                workers = _train_workers(proc.pid)
                if workers:
                    killed = workers[-1]
                    os.kill(killed, signal.SIGKILL)
                    break
            time.sleep(0.05)
        assert killed is not None, "no Train worker to kill after the first checkpoint"
        # The group restarts: new worker processes appear in place of the killed one.
        restarted = False
        while time.monotonic() < deadline and proc.poll() is None:
            workers = _train_workers(proc.pid)
            if workers and killed not in workers and len(workers) == 2:
                restarted = True
                break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert restarted, "no new Train worker replaced the killed one"
    assert "final validation accuracy" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["name"] == "nightly" and summary["run"]["max_failures"] == 1
    assert (out / "metrics.csv").exists() and (out / "throughput.png").exists()
    steps_per_epoch = summary["steps"] // 2
    first_run_steps = max(r["step"] for r in read_metrics_csv(out / "metrics.csv")) + 1

    # Re-submitting the same name without --resume is refused; with --resume it continues
    # from the last checkpoint (epoch 3 only), not from step 0.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(_cli(out, "--run-name", "nightly", "--set", "train.epochs=3")[3:]) == 2
    assert "--resume" in capsys.readouterr().err
    # In this process: no second interpreter importing torch and Ray for the same check.
    assert main(_cli(out, "--run-name", "nightly", "--resume", "--set", "train.epochs=3")[3:]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["run"]["resumed"] is True
    assert again["run"]["first_step"] == first_run_steps  # epoch 3 only, from the checkpoint
    # metrics.csv keeps covering the whole run: the first submission's steps, then these.
    steps = sorted({r["step"] for r in read_metrics_csv(out / "metrics.csv")})
    assert steps == list(range(3 * steps_per_epoch))
