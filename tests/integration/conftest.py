"""Real local Ray clusters, shut down through their handles.

Every test in this folder starts real Ray processes and is marked ``ray`` (``-m "not ray"``
runs the fast unit tests only).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_env import worker_runtime_env

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.ray)
    # Order (each module's tests stay together, so module fixtures start once):
    # * within each module, the tests that use ``ray_local`` run first (otherwise in order);
    # * the modules of this folder whose tests all use ``ray_local`` run first, then those
    #   where some do, then the rest (otherwise in order): each of those tests follows one
    #   that used ``ray_local`` as often as possible, on the same local Ray (a start costs
    #   ~5 s and a shutdown ~1.5 s on 2 cores; see ``ray_local``). Other folders' modules
    #   keep their places.
    module_of = {id(item): str(item.path) for item in items}
    first_index: dict[str, int] = {}
    uses: dict[str, list[bool]] = {}
    for index, item in enumerate(items):
        module = module_of[id(item)]
        first_index.setdefault(module, index)
        uses.setdefault(module, []).append(_uses_ray_local(item))
    here = [m for m in first_index if _HERE in Path(m).resolve().parents]
    block_start = min((first_index[m] for m in here), default=0)

    def module_key(module: str) -> tuple[int, int, int]:
        if module not in here:
            return (first_index[module], 0, 0)
        group = 0 if all(uses[module]) else 1 if any(uses[module]) else 2
        return (block_start, group, first_index[module])

    items.sort(key=lambda item: (*module_key(module_of[id(item)]), not _uses_ray_local(item)))


def _uses_ray_local(item: pytest.Item) -> bool:
    return "ray_local" in getattr(item, "fixturenames", ())


#: The GCS address of the local Ray that ``ray_local`` started, while it may still run.
_LOCAL_RAY: dict[str, str] = {}


def _local_ray_running() -> bool:
    import ray

    return (
        bool(_LOCAL_RAY)
        and ray.is_initialized()
        and ray.get_runtime_context().gcs_address == _LOCAL_RAY["gcs"]
    )


@pytest.fixture
def ray_local():
    """A local Ray instance with room for three 1-CPU workers plus helpers.

    One instance serves consecutive tests that ask for it, across modules (a start costs
    seconds on 2 cores); it is shut down as soon as the next test does not ask for it
    (:func:`pytest_runtest_teardown`), so every other test finds no Ray running, as before.
    A test that shut it down itself (the CLI does) gets a fresh one.
    """
    import ray

    if not _local_ray_running():
        if ray.is_initialized():
            ray.shutdown()
        # address="local": a fresh instance even if a `ray start` cluster runs on this machine.
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=worker_runtime_env(),
        )
        _LOCAL_RAY["gcs"] = ray.get_runtime_context().gcs_address
    return ray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's own teardown: stop ``ray_local``'s Ray unless the next test uses it."""
    result = yield
    if _LOCAL_RAY and (nextitem is None or "ray_local" not in nextitem.fixturenames):
        import ray

        if _local_ray_running():
            ray.shutdown()
        _LOCAL_RAY.clear()
    return result


@pytest.fixture
def run_config(tmp_path):
    """A RunConfig with a unique name in temporary storage (no accidental resume)."""
    import uuid

    from ray.train import RunConfig

    return RunConfig(
        name=f"test-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path / "ray_results")
    )
