"""Connecting the driver to Ray: an existing cluster, or a new embedded local Ray.

The embedded local Ray is private to this machine: every port it opens (GCS, raylet, object
manager, core workers, dashboard agent, runtime-env agent, metrics export) listens on
127.0.0.1 only, and Ray's token authentication stays on. ``tests/integration/
test_network_exposure.py`` lists the sockets of such a Ray and fails if one binds elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from raytrain_hetero.driver._ray_compat import keep_loopback_node_ip, train_env_passthrough
from raytrain_hetero.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["LOOPBACK_IP", "init_ray"]

#: The only address the embedded local Ray listens on.
LOOPBACK_IP = "127.0.0.1"

#: Ray's switch for token authentication (unset: on for a new local Ray in Ray 2.60).
AUTH_MODE_ENV_VAR = "RAY_AUTH_MODE"


def _require_token_auth(environ: Mapping[str, str]) -> None:
    mode = environ.get(AUTH_MODE_ENV_VAR)
    if mode is not None and mode.strip().lower() != "token":
        raise ConfigError(
            f"{AUTH_MODE_ENV_VAR}={mode}: the embedded local Ray keeps token authentication on "
            f"(any local user could otherwise run code in it). Fix: unset {AUTH_MODE_ENV_VAR} "
            "or set it to 'token'; to run without a token, start a cluster yourself and pass "
            "its address in ray.address."
        )


def init_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    dashboard_host: str = LOOPBACK_IP,
) -> None:
    """Connect to ``address``, or start a new embedded local Ray; no-op if Ray is up.

    Ray Train settings given as environment variables of this process (the health-check
    interval) are passed on to every worker through the runtime environment.

    Args:
        address: Cluster address (``"auto"``, ``"ray://host:10001"``, ...); ``None`` starts a
            new embedded local Ray bound to 127.0.0.1 with token authentication, never
            whatever cluster ``ray start`` last left running.
        num_cpus: CPUs of the embedded local Ray (``None``: all of this machine's).
        dashboard_host: Unused by the embedded Ray, which starts no dashboard and binds every
            port to 127.0.0.1 whatever this says; kept so ``ray.dashboard_host`` configs load.

    Raises:
        ConfigError: ``RAY_AUTH_MODE`` turns token authentication off for an embedded Ray.
    """
    import ray

    if ray.is_initialized():
        return
    env_vars = train_env_passthrough(os.environ)
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return
    _require_token_auth(os.environ)
    if dashboard_host != LOOPBACK_IP:
        logger.info(
            "ray.dashboard_host=%s is not used: the embedded Ray starts no dashboard",
            dashboard_host,
        )
    with keep_loopback_node_ip():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            runtime_env=runtime_env,
            log_to_driver=False,
            _node_ip_address=LOOPBACK_IP,
        )
