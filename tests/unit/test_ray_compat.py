"""driver/_ray_compat.py: the installed Ray is the pinned one and every private name resolves."""

from __future__ import annotations

import types

import pytest

from raytrain_hetero.driver._ray_compat import (
    PINNED_RAY_VERSION,
    PRIVATE_APIS,
    PrivateRayAPI,
    RayCompatError,
    check_ray_compat,
)
from raytrain_hetero.errors import HeteroError


def test_installed_ray_is_pinned_and_every_private_api_resolves() -> None:
    check_ray_compat()  # raises RayCompatError naming the moved API otherwise


def test_every_entry_says_why_and_what_would_replace_it() -> None:
    assert len({api.name for api in PRIVATE_APIS}) == len(PRIVATE_APIS)
    for api in PRIVATE_APIS:
        assert api.module.startswith("ray.") and api.why and api.replacement


def test_a_moved_private_api_is_named_with_the_installed_version() -> None:
    fake_state = types.SimpleNamespace()  # the module lost available_resources_per_node
    api = PrivateRayAPI("ray._private.state", "available_resources_per_node", "sizing", "none")
    with pytest.raises(RayCompatError) as info:
        check_ray_compat(
            [api], modules={"ray._private.state": fake_state}, installed_version=PINNED_RAY_VERSION
        )
    message = str(info.value)
    assert "ray._private.state.available_resources_per_node is missing" in message
    assert f"Ray {PINNED_RAY_VERSION}" in message and "sizing" in message
    assert "Fix:" in message
    assert isinstance(info.value, HeteroError)


def test_a_nested_attribute_that_moved_is_found_missing() -> None:
    base = type("ElasticScalingPolicy", (), {"make_decision_for_running_worker_group": None})
    module = types.SimpleNamespace(ElasticScalingPolicy=base)
    api = PrivateRayAPI("fake.scaling", "ElasticScalingPolicy._count_possible_workers", "w", "r")
    with pytest.raises(
        RayCompatError,
        match=r"fake\.scaling\.ElasticScalingPolicy\."
        r"_count_possible_workers is missing",
    ):
        check_ray_compat(
            [api], modules={"fake.scaling": module}, installed_version=PINNED_RAY_VERSION
        )
    present = PrivateRayAPI("fake.scaling", "ElasticScalingPolicy", "w", "r")
    check_ray_compat(
        [present], modules={"fake.scaling": module}, installed_version=PINNED_RAY_VERSION
    )


def test_another_ray_version_is_refused_with_both_versions() -> None:
    with pytest.raises(RayCompatError) as info:
        check_ray_compat([], installed_version="2.61.0")
    assert "installed Ray is 2.61.0" in str(info.value)
    assert f"pinned to {PINNED_RAY_VERSION}" in str(info.value)


def test_no_private_ray_name_outside_the_compat_module() -> None:
    import re
    from pathlib import Path

    import raytrain_hetero

    pattern = re.compile(
        r"ray\._private|ray\.train\.v2\._internal|ray\.train\._internal|_TorchBackend"
        r"|__mixins__|controller\.abort|_initialize_and_run_controller"
    )
    root = Path(raytrain_hetero.__file__).parent
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "compat" not in path.name and pattern.search(path.read_text())
    ]
    assert offenders == [], f"private Ray names outside driver/_ray_compat.py: {offenders}"


def test_collective_timeout_is_set_for_the_block_and_removed_after() -> None:
    from ray.train.v2._internal.constants import COLLECTIVE_TIMEOUT_S_ENV_VAR

    from raytrain_hetero.driver._ray_compat import (
        COLLECTIVE_TIMEOUT_ENV_VAR,
        train_collective_timeout,
    )

    assert COLLECTIVE_TIMEOUT_ENV_VAR == COLLECTIVE_TIMEOUT_S_ENV_VAR  # the name Ray reads
    env: dict[str, str] = {}
    with train_collective_timeout(7, env):
        assert env == {COLLECTIVE_TIMEOUT_ENV_VAR: "7.0"}
    assert env == {}
    with pytest.raises(RuntimeError), train_collective_timeout(7, env):
        raise RuntimeError("fit failed")
    assert env == {}  # removed on failure too


def test_a_collective_timeout_the_user_exported_wins() -> None:
    from raytrain_hetero.driver._ray_compat import (
        COLLECTIVE_TIMEOUT_ENV_VAR,
        train_collective_timeout,
    )

    env = {COLLECTIVE_TIMEOUT_ENV_VAR: "99"}
    with train_collective_timeout(7, env):
        assert env[COLLECTIVE_TIMEOUT_ENV_VAR] == "99"
    assert env == {COLLECTIVE_TIMEOUT_ENV_VAR: "99"}


def _torch_trainer():
    from raytrain_hetero import HeteroTrainer, WorkerSpec

    def loop(config):  # never runs
        raise AssertionError

    return HeteroTrainer(
        loop, workers=[WorkerSpec(name="a"), WorkerSpec(name="b")], batch={"global_batch_size": 8}
    ).torch_trainer()


def test_a_run_without_datasets_starts_no_dataset_manager_per_group() -> None:
    import ray
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    callbacks = _torch_trainer()._create_default_callbacks()
    (callback,) = [cb for cb in callbacks if isinstance(cb, DatasetsCallback)]
    assert type(callback) is not DatasetsCallback  # Ray's would start a DatasetManager actor
    workers = [object(), object(), object()]
    args = callback.before_init_train_context(workers)
    assert not ray.is_initialized()  # nothing started, no actor
    (providers,) = args.values()
    assert len(providers) == 3
    info = types.SimpleNamespace(dataset_name="train")
    # A loop that asks for a shard anyway gets Ray Train's own error, not an AttributeError.
    with pytest.raises(KeyError, match="'train' not found.*`datasets` argument"):
        providers[1].get_dataset_shard(info)


def test_a_run_with_datasets_keeps_ray_trains_dataset_callback() -> None:
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    from raytrain_hetero.driver._ray_compat import without_idle_dataset_manager
    from raytrain_hetero.driver.elastic import HeteroRayTorchTrainer

    trainer = _torch_trainer()
    stock = super(HeteroRayTorchTrainer, trainer)._create_default_callbacks()
    assert any(type(cb) is DatasetsCallback for cb in stock)
    with_data = types.SimpleNamespace(datasets={"train": object()}, train_run_context=None)
    assert without_idle_dataset_manager(stock, with_data) == stock
