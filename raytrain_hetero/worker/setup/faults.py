"""FAULT INJECTION (test and ops tooling): fire the run's configured faults at phase points.

Deterministic, in the spirit of torchft's fault injector: a
:class:`~raytrain_hetero.config.faults.FaultSpec` names a phase, optionally a step, a target
and an action; worker code calls :func:`fault_point` at each phase point (a no-op without
faults). Each fault fires at most once per run, recorded by a marker file written atomically
*before* the action: the action may SIGKILL this process and the restarted group runs in new
processes, so only shared storage can tell them it fired (else a fault at step 5 would fire on
every resume from before step 5).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_hetero.atomic import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    from raytrain_hetero.config.faults import FaultInjectionConfig, FaultSpec
    from raytrain_hetero.worker.setup.identity import RankIdentity

logger = logging.getLogger(__name__)

__all__ = ["CORRUPT_STATE_BYTES", "KILLED_SCHEDULER", "fault_point", "fired_markers", "marker_path"]

#: What ``corrupt_state`` leaves in a checkpoint's state file: not JSON.
CORRUPT_STATE_BYTES = b'{"format": 1, "cursor": \x00\xff corrupted by fault injection'

#: A ``kill_scheduler`` marker's ``effect`` when the actor was found and killed.
KILLED_SCHEDULER = "killed the scheduler actor"


def marker_path(config: FaultInjectionConfig, index: int) -> Path:
    """The marker file recording that fault ``index`` of ``config`` fired."""
    fault = config.faults[index]
    assert config.marker_dir is not None  # the config refuses faults without one
    return Path(config.marker_dir) / f"fault{index:02d}-{fault.phase}-{fault.action}.fired.json"


def fired_markers(config: FaultInjectionConfig) -> list[dict[str, Any]]:
    """The firing records of ``config``'s faults that fired, in fault order."""
    out = []
    for index in range(len(config.faults)):
        path = marker_path(config, index)
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def fault_point(
    identity: RankIdentity,
    phase: str,
    *,
    step: int | None = None,
    model: Any = None,
    state_file: Path | None = None,
) -> None:
    """Fire every configured fault of ``phase`` (and ``step``) that targets this rank.

    ``model`` is what ``nan`` poisons; ``state_file`` the state just written
    (``corrupt_state``).
    """
    config = identity.setup.faults
    if config is None or not config.faults:
        return
    for index, fault in enumerate(config.faults):
        if fault.phase != phase or not fault.targets(identity.spec.name, identity.rank):
            continue
        if fault.step is not None and fault.step != step:
            continue
        marker = marker_path(config, index)
        if marker.exists():
            continue
        record = {
            "fault": index,
            "what": fault.describe(),
            "phase": phase,
            "step": step,
            "rank": identity.rank,
            "worker": identity.spec.name,
            "group": identity.group_id,
            "pid": os.getpid(),
            "time": time.time(),
        }
        # Recorded before acting: the action may end this process.
        atomic_write_json(marker, record)
        logger.warning(
            "FAULT INJECTION: %s (rank %d, worker %s, step %s)",
            fault.describe(),
            identity.rank,
            identity.spec.name,
            step,
        )
        effect = _act(fault, identity, model=model, state_file=state_file)
        if effect is not None:
            # An action this process survives says what it did (a soak checks that a
            # scheduler kill found its actor).
            atomic_write_json(marker, {**record, "effect": effect})


def _act(
    fault: FaultSpec, identity: RankIdentity, *, model: Any, state_file: Path | None
) -> str | None:
    """Do ``fault``'s action; what it did, where this process survives to say."""
    if fault.action == "kill":
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # like `kill -9` of the worker process
    elif fault.action == "hang":
        time.sleep(fault.hang_s)  # the others wait in their next collective until it times out
    elif fault.action == "nan":
        _poison_next_forward(model)
    elif fault.action == "kill_scheduler":
        return _kill_scheduler(identity)
    elif fault.action == "corrupt_state":
        if state_file is None:
            logger.warning("FAULT INJECTION: no checkpoint state written on this rank to corrupt")
            return "no state file to corrupt"
        atomic_write_bytes(state_file, CORRUPT_STATE_BYTES)
        return f"corrupted {state_file.name}"
    return None


def _poison_next_forward(model: Any) -> None:
    """This rank's next forward output (hence loss and gradients) becomes NaN, once."""
    import torch

    if model is None:
        logger.warning("FAULT INJECTION: nan needs the prepared model; nothing poisoned")
        return

    def poison(_module: Any, _inputs: Any, output: Any) -> Any:
        handle.remove()
        return output * torch.tensor(float("nan"), dtype=output.dtype, device=output.device)

    handle = model.register_forward_hook(poison)


def _kill_scheduler(identity: RankIdentity) -> str:
    """``ray.kill`` the run's scheduler actor, found by name; Ray restarts it."""
    import ray

    setup = identity.setup
    if setup.scheduler_name is None:
        logger.warning("FAULT INJECTION: the run has no scheduler actor to kill")
        return "no scheduler actor"
    try:
        actor = ray.get_actor(setup.scheduler_name, namespace=setup.scheduler_namespace)
    except ValueError:
        logger.warning("FAULT INJECTION: scheduler actor %s not found", setup.scheduler_name)
        return "scheduler actor not found"
    ray.kill(actor, no_restart=False)
    return KILLED_SCHEDULER
