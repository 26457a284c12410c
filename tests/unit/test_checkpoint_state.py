"""The versioned resume state written into checkpoints."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from raytrain_hetero.config import BatchConfig
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.state.checkpoint_state import (
    STATE_FILE,
    STATE_FORMAT,
    CheckpointState,
    read_state,
    require_state,
    write_state,
)
from raytrain_hetero.worker.state.rng_state import capture_rng

CARVER = EpochCarver(dataset_size=470, global_batch_size=48, seed=3, min_step_size=3)


def _state() -> CheckpointState:
    plans = [
        Plan.from_shares(48, [1.0, 1.0, 1.0]),
        Plan.from_costs(48, [CostModel(0.001, 0.01)] * 3, version=2, effective_step=6),
    ]
    return CheckpointState.capture(CARVER, Cursor(1, 4), 3, plans, [2, 0, 1])


def test_round_trip_through_a_checkpoint_directory(tmp_path):
    state = _state()
    path = write_state(tmp_path, state)
    assert path == tmp_path / STATE_FILE
    assert json.loads(path.read_text())["format"] == STATE_FORMAT
    assert not [p for p in tmp_path.iterdir() if p.name != STATE_FILE]  # no temporary left
    restored = read_state(tmp_path)
    assert restored == state
    assert restored.global_step == CARVER.global_step(Cursor(1, 4))
    assert restored.slot_costs() == {
        2: CostModel(0.001, 0.01),
        0: CostModel(0.001, 0.01),
        1: CostModel(0.001, 0.01),
    }


def test_a_directory_without_state_reads_as_none(tmp_path):
    assert read_state(tmp_path) is None


def test_an_unknown_format_version_is_refused_with_a_fix(tmp_path):
    data = _state().to_dict()
    data["format"] = STATE_FORMAT + 1
    (tmp_path / STATE_FILE).write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"format version 3.*reads versions 1, 2.*new run"):
        read_state(tmp_path)


def test_a_format_1_file_of_the_previous_release_still_reads(tmp_path):
    # Exactly what the previous worker API wrote (same keys, format 1).
    legacy = {
        "format": 1,
        "cursor": {"epoch": 0, "step_in_epoch": 7},
        "global_step": 7,
        "dataset_size": 470,
        "global_batch_size": 48,
        "seed": 3,
        "min_step_size": 3,
        "world_size": 2,
        "plans": [Plan.from_shares(48, [1.0, 2.0]).to_dict()],
        "rank_slots": None,
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(legacy))
    state = read_state(tmp_path)
    assert state.cursor == Cursor(0, 7) and state.rank_slots is None
    assert state.slot_costs() == {}


def test_resuming_under_another_carving_names_what_differs():
    state = _state()
    state.check_carving(CARVER)
    other = EpochCarver(dataset_size=470, global_batch_size=64, seed=4, min_step_size=3)
    with pytest.raises(ConfigError, match=r"global_batch_size: checkpoint 48 vs now 64, seed"):
        state.check_carving(other)


def test_format_2_carries_every_ranks_generator_state(tmp_path):
    rngs = [capture_rng(), capture_rng()]
    state = CheckpointState.capture(CARVER, Cursor(1, 4), 2, [], [0, 1], rngs)
    write_state(tmp_path, state)
    restored = read_state(tmp_path)
    assert restored == state and restored.rng == tuple(rngs)
    assert json.loads((tmp_path / STATE_FILE).read_text())["format"] == 2


def test_resuming_from_a_checkpoint_without_state_is_refused_with_the_fix(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"weights only")
    with pytest.raises(ConfigError, match=r"/ckpt_7\) has no raytrain_hetero_state.json.*Fix:"):
        require_state(tmp_path, "/ckpt_7")
    write_state(tmp_path, _state())
    assert require_state(tmp_path, "/ckpt_7") == _state()


def _ghost_state(ghost: int, min_slice: int = 1) -> CheckpointState:
    """A 3-rank run's state whose plans cut groups of ``ghost`` (1: not ghost)."""
    batch = BatchConfig(
        global_batch_size=48,
        batchnorm="ghost" if ghost > 1 else "exact",
        ghost_size=max(ghost, 2),
        min_slice=min_slice,
    )
    carver = EpochCarver(470, 48, seed=3, min_step_size=3 * batch.min_slice_samples)
    plans = [
        Plan.from_shares(48, [1.0, 2.0, 3.0], quantum=ghost, min_slice=batch.min_slice_samples),
        Plan.from_costs(
            48,
            [CostModel(0.001, 0.01)] * 3,
            version=2,
            effective_step=6,
            quantum=ghost,
            min_slice=batch.min_slice_samples,
        ),
    ]
    return CheckpointState.capture(carver, Cursor(1, 4), 3, plans, [0, 1, 2])


def test_resuming_with_another_ghost_size_is_refused_by_name(tmp_path):
    write_state(tmp_path, _ghost_state(4))
    state = read_state(tmp_path)  # the group size survives the file
    assert [p.quantum for p in state.plans] == [4, 4]
    state.check_group_size(4)
    with pytest.raises(
        ConfigError, match=r"ghost_size 4, this run asks for .*ghost_size 8.*new run"
    ):
        state.check_group_size(8)
    with pytest.raises(ConfigError, match=r"ghost_size 4, this run asks for no ghost BatchNorm"):
        state.check_group_size(1)
    with pytest.raises(ConfigError, match=r"trained with no ghost BatchNorm.*ghost_size 16"):
        _ghost_state(1).check_group_size(16)
    _ghost_state(1).check_group_size(1)  # exact or local: nothing to compare
    # min_slice 8 in groups of 4 or of 8: the same carving (min_step_size 24), other groups.
    a, b = _ghost_state(4, min_slice=8), _ghost_state(8, min_slice=8)
    assert a.min_step_size == b.min_step_size == 24
    carver_b = EpochCarver(470, 48, seed=3, min_step_size=b.min_step_size)
    a.check_carving(carver_b)  # the carving alone would let it resume
    with pytest.raises(ConfigError, match=r"ghost_size 4.*ghost_size 8"):
        a.check_group_size(8)


def test_restore_from_checkpoint_refuses_another_ghost_size_before_adopting_plans(
    tmp_path, monkeypatch
):
    """The resume path itself (``restore_from_checkpoint``, no Ray session): a checkpoint
    cut in groups of 4 under a run with ghost_size 8 is refused, the plans not adopted."""
    import ray.train

    from raytrain_hetero.worker.plan.planning import PlanState
    from raytrain_hetero.worker.runtime.resume import restore_from_checkpoint

    state = _ghost_state(4, min_slice=8)  # min_step_size 24 under ghost_size 8 too
    write_state(tmp_path, state)
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: ray.train.Checkpoint(str(tmp_path)))
    carver = EpochCarver(470, 48, seed=3, min_step_size=state.min_step_size)

    def runtime(ghost: int) -> SimpleNamespace:
        batch = BatchConfig(global_batch_size=48, batchnorm="ghost", ghost_size=ghost, min_slice=8)
        identity = SimpleNamespace(setup=SimpleNamespace(batch=batch), rank=0, world_size=3)
        return SimpleNamespace(identity=identity, plans=PlanState(), pending_rng=None)

    refused = runtime(8)
    with pytest.raises(ConfigError, match=r"ghost_size 4, this run asks for .*ghost_size 8"):
        restore_from_checkpoint(refused, carver)
    assert refused.plans.history == []
    same = runtime(4)
    assert restore_from_checkpoint(same, carver) == Cursor(1, 4)
    assert [p.quantum for p in same.plans.history] == [4, 4]
