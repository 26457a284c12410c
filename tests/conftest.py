"""Settings every test process needs before Ray or torch start."""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Must be set before Ray Train starts: reports otherwise block ~2 s each.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# Ray Train starts a node-drain watcher actor per worker group (a new process importing
# ray.train: ~1.6 s of CPU per group start, ~70 starts per run). No test drains a node;
# the library neither uses nor replaces it. Ray Train propagates this to its controller.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


# ------------------------------------------------------------------- the test process's end

_SESSIONS: list[pytest.Session] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SESSIONS.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with pytest's own exit status, without the interpreter's teardown.

    A full fresh-clone run once printed "1962 passed" and then died of a segmentation fault
    in the interpreter's teardown (native libraries' threads and static objects: Ray's core
    worker, gloo, Arrow), which turned a passed suite into a failed command. Everything a
    test owns is already released by its fixtures; here Ray is shut down through its handle
    if a test left it up, the exit handlers run, the streams are flushed, and the process
    exits with the status pytest decided.
    """
    del config
    if not _SESSIONS:
        return
    status = int(_SESSIONS[-1].exitstatus)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    atexit._run_exitfuncs()  # the handlers a normal exit would run
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# ------------------------------------------------------------------------------ S3 server


@dataclass(frozen=True)
class S3Store:
    """A real S3-compatible server (moto's, over HTTP on 127.0.0.1) with one empty bucket.

    Attributes:
        endpoint: ``http://127.0.0.1:PORT``.
        bucket: The bucket's name.
        env: The environment a process needs to reach it (dummy credentials, region).
    """

    endpoint: str
    bucket: str
    env: dict[str, str]

    def filesystem(self) -> Any:
        """A pyarrow S3 filesystem on the server (credentials from the environment)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http")

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key below ``prefix`` of the bucket, sorted."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(
            f"{self.bucket}/{prefix}".rstrip("/"), recursive=True, allow_not_found=True
        )
        return sorted(
            info.path.removeprefix(f"{self.bucket}/")
            for info in self.filesystem().get_file_info(selector)
            if info.type == pafs.FileType.File
        )


@pytest.fixture(scope="module")
def s3_store() -> Iterator[S3Store]:
    """moto's S3 server in a thread of this process, stopped afterwards; dummy credentials
    in this process's environment for the module's duration (restored after)."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        store = S3Store(f"http://{host}:{port}", "rh-test", env)
        pafs.S3FileSystem(
            endpoint_override=store.endpoint, scheme="http", allow_bucket_creation=True
        ).create_dir(store.bucket)
        yield store
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
