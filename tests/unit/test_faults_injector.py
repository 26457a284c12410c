"""FAULT INJECTION tooling without Ray: fault validation, the seeded draw, and the injector's
once-per-run firing on real files and real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from raytrain_hetero import HeteroTrainer
from raytrain_hetero.config import (
    BatchConfig,
    FaultInjectionConfig,
    FaultSpec,
    WorkerSpec,
)
from raytrain_hetero.config.faults import random_faults
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.setup.faults import (
    CORRUPT_STATE_BYTES,
    KILLED_SCHEDULER,
    fault_point,
    fired_markers,
)
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity


def identity(config: FaultInjectionConfig | None, rank: int = 0) -> RankIdentity:
    specs = (WorkerSpec(name="a"), WorkerSpec(name="b"))
    setup = HeteroSetup(
        run_id="r",
        specs=specs,
        batch=BatchConfig(global_batch_size=8),
        faults=config,
    )
    return RankIdentity(setup=setup, slot=rank, rank=rank, world_size=2, group_id="g1")


def test_a_fault_names_exactly_one_target_and_fits_its_phase(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of worker= or rank="):
        FaultSpec(phase="probe", action="kill")
    with pytest.raises(ConfigError, match=r"step: phase 'probe' happens before training"):
        FaultSpec(phase="probe", action="kill", rank=0, step=3)
    with pytest.raises(ConfigError, match="action: action 'nan'.*Fix: use phase: mid_epoch"):
        FaultSpec(phase="probe", action="nan", rank=0)
    with pytest.raises(ConfigError, match="corrupt_state"):
        FaultSpec(phase="mid_epoch", action="corrupt_state", rank=0)
    with pytest.raises(ConfigError, match="marker_dir"):
        FaultInjectionConfig(faults=[FaultSpec(phase="probe", action="kill", rank=0)])
    assert not FaultInjectionConfig().active  # off by default


def test_the_trainer_rejects_a_fault_aimed_at_no_worker(tmp_path):
    def loop():  # never runs
        raise AssertionError

    faults = FaultInjectionConfig(
        faults=[FaultSpec(phase="mid_epoch", action="kill", worker="c", step=1)],
        marker_dir=tmp_path,
    )
    with pytest.raises(ConfigError, match=r"faults\.faults\[0\]\.worker: names worker 'c'"):
        HeteroTrainer(
            loop, workers=[{"name": "a"}, {"name": "b"}], batch={"global_batch_size": 8},
            faults=faults,
        )  # fmt: skip
    trainer = HeteroTrainer(loop, workers=[{"name": "a"}], batch={"global_batch_size": 8})
    assert trainer.setup().faults is None  # nothing reaches the workers unless configured


def test_random_faults_are_seeded_and_land_where_the_loop_can_meet_them():
    kw = {
        "steps": 20,
        "world_size": 3,
        "actions": ("kill", "hang"),
        "phases": ("probe", "plan_switch", "mid_epoch", "checkpoint_commit"),
        "checkpoint_every": 4,
        "switch_steps": (5, 15),
    }
    a = random_faults(3, 40, **kw)
    assert a == random_faults(3, 40, **kw)
    assert a != random_faults(4, 40, **kw)
    assert {f.phase for f in a} == set(kw["phases"])
    for fault in a:
        if fault.phase == "checkpoint_commit":
            assert (fault.step + 1) % 4 == 0
        elif fault.phase == "plan_switch":
            assert fault.step in (5, 15)
        elif fault.phase == "mid_epoch":  # not after a checkpoint: the step can recur
            assert 0 <= fault.step < 19 and (fault.step + 1) % 4 != 0
        else:
            assert fault.step is None
        assert 0 <= fault.rank < 3


def test_a_fault_fires_once_on_its_target_at_its_step(tmp_path):
    state = tmp_path / "ckpt" / "raytrain_hetero_state.json"
    state.parent.mkdir()
    state.write_text('{"format": 1}')
    config = FaultInjectionConfig(
        faults=[FaultSpec(phase="checkpoint_commit", action="corrupt_state", step=3, rank=1)],
        marker_dir=tmp_path / "markers",
    )
    fault_point(identity(config, rank=0), "checkpoint_commit", step=3, state_file=state)
    fault_point(identity(config, rank=1), "checkpoint_commit", step=2, state_file=state)
    fault_point(identity(config, rank=1), "mid_epoch", step=3, state_file=state)
    assert state.read_text() == '{"format": 1}' and fired_markers(config) == []
    fault_point(identity(config, rank=1), "checkpoint_commit", step=3, state_file=state)
    assert state.read_bytes() == CORRUPT_STATE_BYTES
    (marker,) = fired_markers(config)
    assert marker["rank"] == 1 and marker["step"] == 3 and marker["group"] == "g1"
    assert marker["effect"] == f"corrupted {state.name}"  # an action it survived says so
    state.write_text('{"format": 1}')
    # A restarted group reaches the same point again: the marker says it already fired.
    fault_point(identity(config, rank=1), "checkpoint_commit", step=3, state_file=state)
    assert state.read_text() == '{"format": 1}'


def test_a_scheduler_kill_records_whether_it_found_the_actor(tmp_path):
    config = FaultInjectionConfig(
        faults=[FaultSpec(phase="probe", action="kill_scheduler", rank=0)], marker_dir=tmp_path
    )
    no_scheduler = identity(config)
    assert no_scheduler.setup.scheduler_name is None
    fault_point(no_scheduler, "probe")
    # Fired (once per run) but without an actor to kill: a soak counting scheduler kills
    # must not count this one.
    (marker,) = fired_markers(config)
    assert marker["effect"] == "no scheduler actor" != KILLED_SCHEDULER


def test_kill_is_a_sigkill_of_the_process_itself_recorded_before(tmp_path):
    config = FaultInjectionConfig(
        faults=[FaultSpec(phase="probe", action="kill", worker="b")], marker_dir=tmp_path
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from raytrain_hetero.config import FaultInjectionConfig
        from raytrain_hetero.worker.setup.faults import fault_point
        from test_faults_injector import identity
        config = FaultInjectionConfig.model_validate_json({config.model_dump_json()!r})
        fault_point(identity(config, rank=1), "probe")
        print("survived")
        """
    )
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert json.loads(next(tmp_path.glob("*.fired.json")).read_text())["worker"] == "b"
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == "survived", again.stderr


def test_nan_poisons_the_next_forward_pass_once(tmp_path):
    import torch

    config = FaultInjectionConfig(
        faults=[FaultSpec(phase="mid_epoch", action="nan", step=2, rank=0)], marker_dir=tmp_path
    )
    model = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3)
    fault_point(identity(config), "mid_epoch", step=2, model=model)
    poisoned = model(x)
    assert torch.isnan(poisoned).all()
    poisoned.sum().backward()
    assert torch.isnan(model.weight.grad).all()  # what the step guard must refuse to apply
    assert torch.isfinite(model(x)).all()  # once only
    assert torch.isfinite(model.weight).all()  # the parameters themselves are untouched


def test_a_corrupted_state_file_is_a_clear_error_naming_it(tmp_path):
    from raytrain_hetero.worker.state.checkpoint_state import STATE_FILE, read_state

    (tmp_path / STATE_FILE).write_bytes(CORRUPT_STATE_BYTES)  # not even UTF-8
    with pytest.raises(ConfigError) as err:
        read_state(tmp_path)
    message = str(err.value)
    assert str(tmp_path / STATE_FILE) in message and "is not valid JSON" in message
    assert "Fix: resume from an earlier checkpoint, or start a new run" in message
