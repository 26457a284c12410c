"""Sample ledgers and restore digests: what a run did, written by the workers, read by tests.

Worker side (called inside train loops, every file append-only, one per rank and group):

* ``ledger_rank{r}_{group}.jsonl``: per step, the sample ids the rank consumed;
* ``digests.jsonl`` (rank 0): at every checkpoint, the digest of the parameters it holds
  together with the cursor (global step) the checkpoint resumes at;
* ``restores_rank{r}.jsonl``: at every worker-group start, the cursor the group resumes at
  and the digest of the parameters it restored (or started from).

Test side: :func:`committed_ledger` keeps, of each group, the steps before the next group's
resume cursor: the updates after it were rolled back with the old group's model state.
Dropping them is only correct if the restored model state IS the state at that cursor, which
:func:`assert_restores_match` checks: every restore's parameter digest equals the digest the
writer recorded for that cursor (a restore that paired a model with another checkpoint's
cursor fails it).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch


def params_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters and buffers, bit for bit."""
    module = getattr(model, "module", model)
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _append(path: Path, entry: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()


def record_restore(out: Path, info: dict, resume_step: int, model: torch.nn.Module) -> None:
    """Worker side: this group resumes at ``resume_step`` with ``model``'s parameters."""
    _append(
        Path(out) / f"restores_rank{info['rank']}.jsonl",
        {
            "group": info["group"],
            "world": info["world_size"],
            "resume_step": resume_step,
            "digest": params_digest(model),
            "time": time.time(),
        },
    )


def record_checkpoint(out: Path, info: dict, resume_step: int, model: torch.nn.Module) -> None:
    """Worker side (rank 0): the checkpoint being written resumes at ``resume_step``."""
    _append(
        Path(out) / "digests.jsonl",
        {"group": info["group"], "resume_step": resume_step, "digest": params_digest(model)},
    )


def record_step(ledger, epoch: int, step: int, ids: list[int], info: dict) -> None:
    """Worker side: the sample ids of one step on this rank (``ledger``: an open file)."""
    entry = {"epoch": epoch, "step": step, "ids": ids, "world": info["world_size"]}
    ledger.write(json.dumps({**entry, "group": info["group"]}) + "\n")
    ledger.flush()


def initial_digest(model: torch.nn.Module) -> str:
    """Digest of a freshly built model (what a group without a checkpoint starts from)."""
    return params_digest(model)


# ----------------------------------------------------------------------------- test side


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def restores(out: Path) -> list[dict]:
    """Every group start, in time order, one entry per group (rank 0's; all ranks checked)."""
    by_group: dict[str, list[dict]] = {}
    for path in Path(out).glob("restores_rank*.jsonl"):
        rank = int(path.stem.removeprefix("restores_rank"))
        for entry in _read_jsonl(path):
            by_group.setdefault(entry["group"], []).append({**entry, "rank": rank})
    starts = []
    for entries in by_group.values():
        # Every rank of a group restored the same cursor and the same parameters.
        assert len({(e["resume_step"], e["digest"]) for e in entries}) == 1, entries
        starts.append(min(entries, key=lambda e: e["time"]))
    return sorted(starts, key=lambda e: e["time"])


def assert_restores_match(out: Path, fresh_digest: str | None = None) -> list[dict]:
    """Every restored model state is the state recorded at its cursor; returns the starts.

    Args:
        out: The run's ledger directory.
        fresh_digest: Digest of the initial model; groups resuming at step 0 without a
            checkpoint must hold exactly it.
    """
    recorded: dict[int, set[str]] = {}
    digests_file = Path(out) / "digests.jsonl"
    if digests_file.exists():
        for entry in _read_jsonl(digests_file):
            recorded.setdefault(entry["resume_step"], set()).add(entry["digest"])
    starts = restores(out)
    assert starts, "no worker group recorded its start"
    for start in starts:
        step, digest = start["resume_step"], start["digest"]
        if step == 0 and fresh_digest is not None and digest == fresh_digest:
            continue
        assert step in recorded, f"group {start['group']} resumed at step {step}: no checkpoint"
        assert digest in recorded[step], (
            f"group {start['group']} resumed at step {step} with parameters that no checkpoint "
            f"recorded for that cursor (model state and cursor come from different checkpoints)"
        )
    return starts


def committed_ledger(out: Path) -> tuple[list[dict], list[list[dict]]]:
    """Ledger entries that reached the final model, and every group's entries in start order.

    A group's entries count up to the next group's resume cursor (from the restore records,
    checked by :func:`assert_restores_match`).
    """
    by_group: dict[str, list[dict]] = {}
    for path in Path(out).glob("ledger_rank*_*.jsonl"):
        rank = int(path.name.split("_")[1].removeprefix("rank"))
        for entry in _read_jsonl(path):
            by_group.setdefault(entry["group"], []).append({**entry, "rank": rank})
    starts = restores(out)
    started = {s["group"] for s in starts}
    assert set(by_group) <= started, "a group ran steps without recording its start"
    kept: list[dict] = []
    for i, start in enumerate(starts):
        # The next group's resume cursor ends this group's updates (the rest rolled back).
        nxt = starts[i + 1]["resume_step"] if i + 1 < len(starts) else None
        kept += [e for e in by_group.get(start["group"], []) if nxt is None or e["step"] < nxt]
    return kept, [by_group[s["group"]] for s in starts if s["group"] in by_group]


def assert_exactly_once(entries: list[dict], size: int, epochs) -> None:
    """Every sample id once per epoch in ``entries``."""
    for epoch in epochs:
        ids = Counter(i for e in entries if e["epoch"] == epoch for i in e["ids"])
        assert sorted(ids) == list(range(size)), f"epoch {epoch} missed samples"
        assert max(ids.values()) == 1, f"epoch {epoch} repeated samples"


def samples_lost(entries: list[dict], size: int, epochs) -> int:
    """Samples missing or repeated over ``epochs`` (0 = exactly once)."""
    lost = 0
    for epoch in epochs:
        ids = Counter(i for e in entries if e["epoch"] == epoch for i in e["ids"])
        lost += sum(1 for i in range(size) if ids.get(i, 0) != 1)
    return lost


def max_param_diff(a: Path, b: Path) -> float:
    """Largest absolute difference between two saved parameter vectors."""
    return float(np.max(np.abs(np.load(a) - np.load(b))))
