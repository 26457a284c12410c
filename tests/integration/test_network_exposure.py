"""The embedded local Ray the CLI starts (``driver.session.init_ray``) is reachable from this
machine only: every listening TCP socket of its processes is bound to loopback, none of them
accepts a connection on a non-loopback address of the machine, and token auth is on.

The sockets are read from /proc for the process tree of this test (the driver and the GCS,
raylet, agents and workers it started), so other Ray instances on the machine do not count.
They are sampled every 0.1 s during one HeteroTrainer fit (two workers, a few steps, a
failure and a restart): the training workers and their process groups (rendezvous store,
gloo) count too.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from network_sockets import (
    ListeningSocket,
    connect_outcome,
    descendants,
    exposed_listeners_outside,
    exposure_loop,
    listening_sockets,
    non_loopback_ipv4_addresses,
)
from ray_env import INTEGRATION_DIR

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver.session import init_ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

#: Processes whose ports must be among the sockets seen, or the check would be vacuous.
_EXPECTED = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _session_sockets() -> list[ListeningSocket]:
    return listening_sockets(descendants(os.getpid()))


def _fit_while_sampling(out, storage) -> tuple[set[ListeningSocket], dict[int, tuple[int, int]]]:
    """One fit of :func:`exposure_loop`; every socket seen meanwhile, and each attempt's store."""
    from ray.train import FailureConfig, RunConfig

    seen: set[ListeningSocket] = set()
    stores: dict[int, tuple[int, int]] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            current = _session_sockets()
            seen.update(current)
            for attempt in (0, 1):
                path = out / f"store-{attempt}"
                fields = path.read_text().split() if path.exists() else []
                if attempt not in stores and len(fields) == 2:  # written in full
                    pid, port = map(int, fields)
                    if any(s.pid == pid and s.port == port for s in current):
                        stores[attempt] = (pid, port)
                        (out / f"seen-{attempt}").touch()
            time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        result = HeteroTrainer(
            exposure_loop,
            train_loop_config={"out": str(out)},
            workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
            batch=BatchConfig(global_batch_size=8, fixed_shares=[1.0, 1.0]),
            run_config=RunConfig(
                name="exposure",
                storage_path=str(storage),
                failure_config=FailureConfig(max_failures=1),
            ),
        ).fit()
    finally:
        done.set()
        poller.join()
    assert result.error is None
    return seen, stores


@pytest.fixture(scope="module")
def embedded_ray(tmp_path_factory):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # The Ray workers inherit this process's environment: the loop is imported by reference.
    saved_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (INTEGRATION_DIR, saved_path) if p)
    init_ray(num_cpus=2)

    @ray.remote(num_cpus=0)
    class Echo:
        def pid(self) -> int:
            return os.getpid()

    @ray.remote(num_cpus=0)
    def task_pid() -> int:
        return os.getpid()

    actor = Echo.remote()
    worker_pids = {ray.get(actor.pid.remote()), ray.get(task_pid.remote())}
    # The agents come up a little after the raylet: wait until each listens.
    deadline = time.monotonic() + 60
    while True:
        sockets = _session_sockets()
        seen = " ".join(s.process for s in sockets)
        missing = [name for name in _EXPECTED if name not in seen]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    before_fit = _session_sockets()  # idle workers may be gone after the fit
    out = tmp_path_factory.mktemp("exposure")
    training, stores = _fit_while_sampling(out, tmp_path_factory.mktemp("results"))
    yield {
        "gcs_port": gcs_port,
        "worker_pids": worker_pids,
        "actor": actor,
        "ray": ray,
        "sockets": before_fit,
        "training": training,
        "stores": stores,
    }
    ray.shutdown()
    if saved_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved_path


def test_every_socket_of_the_embedded_ray_is_bound_to_loopback(embedded_ray):
    ray = embedded_ray["ray"]
    sockets = embedded_ray["sockets"]
    report = "\n".join(map(str, sockets))
    seen = " ".join(s.process for s in sockets)
    for name in _EXPECTED:
        assert name in seen, f"no listening socket of {name} found:\n{report}"
    assert embedded_ray["gcs_port"] in {s.port for s in sockets}, report
    assert embedded_ray["worker_pids"] <= {s.pid for s in sockets}, (
        f"the worker processes {embedded_ray['worker_pids']} listen on nothing?\n{report}"
    )
    exposed = [str(s) for s in sockets if not s.loopback_only]
    assert exposed == [], "listening beyond loopback:\n" + "\n".join(exposed)
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    # Token authentication stays on (Ray 2.60 turns it on for a new local Ray, via this variable).
    assert os.environ.get("RAY_AUTH_MODE") == "token"


def test_training_workers_and_their_process_groups_listen_on_loopback_only(embedded_ray):
    """Sampled during the fit: both attempts' rendezvous stores, gloo, the train workers."""
    training = embedded_ray["training"]
    report = "\n".join(sorted(map(str, training)))
    stores = embedded_ray["stores"]
    assert sorted(stores) == [0, 1], f"rendezvous store of each attempt not seen: {stores}"
    assert stores[0][0] != stores[1][0], "the restart ran in the same process?"
    for pid, port in stores.values():
        store = [s for s in training if s.pid == pid and s.port == port]
        assert store and all(s.loopback_only for s in store), report
    exposed = [str(s) for s in training if not s.loopback_only]
    assert exposed == [], "listening beyond loopback during training:\n" + "\n".join(exposed)


def test_no_port_of_the_embedded_ray_answers_on_a_non_loopback_address(embedded_ray):
    addresses = non_loopback_ipv4_addresses()
    if not addresses:
        pytest.skip(
            "this machine has no non-loopback IPv4 address, so there is no outside address to "
            "connect through; the bind-address test above still checks every socket"
        )
    session = descendants(os.getpid())
    ports = sorted({s.port for s in listening_sockets(session)})
    assert embedded_ray["gcs_port"] in ports
    # A port another program listens on beyond loopback (another Ray on a shared machine uses
    # the same default agent ports) would answer for that program: such ports are set aside,
    # named in the message, and the bind-address test still covers them for this session.
    others = {port: exposed_listeners_outside(session, port) for port in ports}
    checked = [port for port in ports if not others[port]]
    assert embedded_ray["gcs_port"] in checked, f"GCS port shared with another program: {others}"
    outcomes = {
        (address, port): connect_outcome(address, port) for address in addresses for port in checked
    }
    reachable = {where: what for where, what in outcomes.items() if what != "refused"}
    shared = {port: who for port, who in others.items() if who}
    assert reachable == {}, (
        f"ports of the embedded Ray answer outside loopback: {reachable} "
        f"(ports set aside, held beyond loopback by other programs: {shared})"
    )
