"""Connecting the driver to Ray: an existing cluster, or a new embedded local Ray."""

from __future__ import annotations

import logging
import os

from raytrain_hetero.driver._ray_compat import train_env_passthrough

logger = logging.getLogger(__name__)

__all__ = ["init_ray"]


def init_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    dashboard_host: str = "127.0.0.1",
) -> None:
    """Connect to ``address``, or start a new embedded local Ray; no-op if Ray is up.

    Ray Train settings given as environment variables of this process (the health-check
    interval) are passed on to every worker through the runtime environment.

    Args:
        address: Cluster address (``"auto"``, ``"ray://host:10001"``, ...); ``None`` starts a
            new embedded local Ray, never whatever cluster ``ray start`` last left running.
        num_cpus: CPUs of the embedded local Ray (``None``: all of this machine's).
        dashboard_host: Interface the embedded Ray's dashboard would bind to (the dashboard
            is not started).
    """
    import ray

    if ray.is_initialized():
        return
    env_vars = train_env_passthrough(os.environ)
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return
    ray.init(
        address="local",
        num_cpus=num_cpus,
        dashboard_host=dashboard_host,
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=False,
    )
