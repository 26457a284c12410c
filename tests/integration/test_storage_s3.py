"""A job whose storage and outputs are in S3, against a real S3-compatible server (moto's,
over HTTP on 127.0.0.1, see tests/conftest.py): ``raytrain-hetero train`` checkpoints into
the bucket, survives ``kill -9`` of one of its Train workers (the group restarts and
checkpoints again), is then killed itself (``kill -9`` of its whole process tree), resumes
from the bucket by run name past step 0, and ``raytrain-hetero predict`` loads that run's
checkpoint from the bucket and writes its outputs there. Endpoint and scheme travel in
``ray.storage_filesystem`` (the pyarrow filesystem pickled to every Ray worker); credentials
only in the environment.

(The worker ``kill -9`` was a test of its own in test_service.py, with local storage: one run
here proves both, a CLI start and two fits fewer.)
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lean_job import lean_job
from network_sockets import descendants

pytestmark = pytest.mark.timeout(600)

RUN = "s3run"
EPOCHS = 5


def _job(s3_store) -> dict:
    """The lean job for 5 epochs (a worker restart may survive), its run storage and its
    outputs in the bucket."""
    return lean_job(
        name="s3lean",
        train={"epochs": EPOCHS, "max_failures": 1},
        ray={
            "storage_path": f"s3://{s3_store.bucket}/runs",
            "storage_filesystem": {"endpoint_override": s3_store.endpoint, "scheme": "http"},
        },
        output_dir=f"s3://{s3_store.bucket}/out",
    )


def _cli(tmp_path: Path, command: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "raytrain_hetero",
        command,
        str(tmp_path / "s3lean.yaml"),
        *extra,
    ]


def _env(s3_store) -> dict[str, str]:
    # Credentials reach the driver and (inherited by the embedded Ray) every worker from the
    # environment only; the endpoint is in the YAML.
    return {**os.environ, **s3_store.env, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


def _kill_tree(proc: subprocess.Popen) -> None:
    """kill -9 the CLI's session, then any process of its tree still alive (by PID)."""
    tree = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _train_workers(root: int) -> list[int]:
    """PIDs of the Ray Train worker processes below the CLI process ``root``."""
    pids = []
    for pid in descendants(root)[1:]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "RayTrainWorker" in cmdline:
            pids.append(pid)
    return sorted(pids)


def _checkpoints(s3_store) -> set[str]:
    """The run's checkpoint folders in the bucket that hold a model."""
    return {k.split("/")[2] for k in s3_store.keys(f"runs/{RUN}") if k.endswith("/model.pt")}


def _read(s3_store, key: str) -> bytes:
    with s3_store.filesystem().open_input_stream(f"{s3_store.bucket}/{key}") as stream:
        return bytes(stream.read())


def test_train_in_s3_is_killed_resumes_by_name_and_predict_reads_the_bucket(
    s3_store, tmp_path, monkeypatch, capsys
):
    (tmp_path / "s3lean.yaml").write_text(yaml.safe_dump(_job(s3_store)))
    env = _env(s3_store)
    snapshot = f"runs/{RUN}/checkpoint_manager_snapshot.json"

    # 1. Train until a checkpoint (and Ray Train's snapshot of it) is in the bucket; kill -9
    #    one Train worker: the group restarts (max_failures=1) and checkpoints again; then
    #    kill -9 the driver with its whole Ray.
    stderr_file = (tmp_path / "train.stderr").open("w+")
    proc = subprocess.Popen(
        _cli(tmp_path, "train", "--run-name", RUN, "--no-progress"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr_file,  # a file: a full pipe would block the driver
        text=True,
        start_new_session=True,
    )

    def stderr_tail() -> str:
        stderr_file.seek(0)
        return stderr_file.read()[-3000:]

    killed, restarted, later = None, False, set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            keys = s3_store.keys(f"runs/{RUN}")
            if snapshot in keys and any(k.endswith("/model.pt") for k in keys):
                workers = _train_workers(proc.pid)
                if workers:
                    killed = workers[-1]
                    os.kill(killed, signal.SIGKILL)
                    break
            time.sleep(0.1)
        assert killed is not None, f"no Train worker to kill after a checkpoint: {stderr_tail()}"
        # The group restarts: new worker processes appear in place of the killed one ...
        while time.monotonic() < deadline and proc.poll() is None:
            workers = _train_workers(proc.pid)
            if workers and killed not in workers and len(workers) == 2:
                restarted = True
                break
            time.sleep(0.1)
        assert restarted, f"no new Train worker replaced the killed one: {stderr_tail()}"
        # ... and trains on: a checkpoint the restarted group wrote reaches the bucket.
        before = _checkpoints(s3_store)
        while time.monotonic() < deadline and proc.poll() is None:
            later = _checkpoints(s3_store) - before
            if later:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it was killed: {stderr_tail()}"
        assert later, f"the restarted group wrote no checkpoint: {stderr_tail()}"
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
        stderr_file.close()
    assert proc.returncode == -signal.SIGKILL
    # Killed before its end: no outputs were published, nothing was written locally.
    assert s3_store.keys("out") == []
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "outputs").exists()

    # 2. The same name without --resume is refused (the run is found in the bucket); with
    #    --resume it continues from the bucket's checkpoint, past step 0.
    from raytrain_hetero.app.cli import main

    monkeypatch.chdir(tmp_path)  # the job's relative data root
    assert main(_cli(tmp_path, "train", "--run-name", RUN, "--no-progress")[3:]) == 2
    refused = capsys.readouterr().err
    assert "--resume" in refused and f"s3://{s3_store.bucket}/runs/{RUN}" in refused
    # The resume and predict run in this process (no second interpreter to import torch and
    # Ray): its environment holds the same credentials (the s3_store fixture set them).
    assert main(_cli(tmp_path, "train", "--run-name", RUN, "--resume", "--no-progress")[3:]) == 0
    assert "final validation accuracy" in capsys.readouterr().out
    outputs = s3_store.keys("out")
    assert {"out/metrics.csv", "out/summary.json", "out/throughput.png"} <= set(outputs)
    summary = json.loads(_read(s3_store, "out/summary.json"))
    metrics_csv = _read(s3_store, "out/metrics.csv").decode()
    assert summary["run"]["resumed"] is True
    assert summary["run"]["name"] == RUN and summary["run"]["max_failures"] == 1
    assert summary["run"]["folder"] == f"s3://{s3_store.bucket}/runs/{RUN}"
    steps = sorted({int(r["step"]) for r in csv.DictReader(io.StringIO(metrics_csv))})
    steps_per_epoch, rest = divmod(steps[-1] + 1, EPOCHS)  # the run's epochs, to the end
    first = summary["run"]["first_step"]
    assert rest == 0 and steps == list(range(first, EPOCHS * steps_per_epoch))
    # Resumed from an epoch-end checkpoint in the bucket, not from step 0.
    assert first > 0 and first % steps_per_epoch == 0
    assert _read(s3_store, "out/throughput.png").startswith(b"\x89PNG")

    # 3. predict loads the run's newest checkpoint from the bucket (by the run folder's URI)
    #    and writes its outputs there.
    predict = _cli(
        tmp_path,
        "predict",
        "--checkpoint",
        f"s3://{s3_store.bucket}/runs/{RUN}",
        "--output",
        f"s3://{s3_store.bucket}/out/predict",
        "--batch-size",
        "16",
    )
    assert main(predict[3:]) == 0
    keys = s3_store.keys("out/predict")
    assert "out/predict/predict_summary.json" in keys
    parts = [k for k in keys if k.startswith("out/predict/predictions/") and k.endswith(".parquet")]
    assert parts, keys
    result = json.loads(_read(s3_store, "out/predict/predict_summary.json"))
    assert result["checkpoint"].startswith(f"s3://{s3_store.bucket}/runs/{RUN}/checkpoint_")
    assert result["checkpoint"].endswith("/model.pt")
    import pyarrow.parquet as pq

    rows = sum(pq.read_table(io.BytesIO(_read(s3_store, k))).num_rows for k in parts)
    assert rows == result["samples"] > 0
    assert not (tmp_path / "s3:").exists()
