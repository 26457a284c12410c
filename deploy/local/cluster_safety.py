"""Private state and process identity for ``local_cluster.py`` (its sibling; stdlib only).

* :func:`secure_state_dir` creates the cluster's state directory with mode 0700 and refuses
  an existing one that is a symlink, owned by another user, or open to group/others.
* :class:`ProcessIdentity` names a process by PID *and* start time (from /proc), so a PID
  reused after the process ended is never taken for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ClusterStateError",
    "ProcStat",
    "ProcessIdentity",
    "all_proc_stats",
    "check_private",
    "proc_stat",
    "secure_state_dir",
    "token_digest",
]


class ClusterStateError(RuntimeError):
    """The state directory or a file in it is not private to this user, or not ours."""


def check_private(path: Path, *, kind: str) -> os.stat_result:
    """``path`` (not followed if a symlink) is a ``kind`` owned by us, closed to others."""
    info = os.lstat(path)
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not wanted(info.st_mode):
        problem = f"is not a {kind}"
    elif info.st_uid != os.getuid():
        problem = f"is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    elif info.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(info.st_mode):04o}: group/others may use it"
    if problem:
        raise ClusterStateError(
            f"refusing the cluster {kind} {path}: it {problem}, so another user could have "
            f"planted or could read its token. Fix: remove it, or pass a private --state-dir "
            f"(a new directory is created with mode 0700)."
        )
    return info


def secure_state_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700 if absent; refuse it unless private to this user."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_private(path, kind="directory")
    return path


def token_digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as /proc names it: PID plus start time (clock ticks after boot), so a PID
    reused by another process after ours ended is never taken for ours."""

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        """The same process still runs (and is not a zombie)."""
        found = proc_stat(self.pid)
        return found is not None and found.start_ticks == self.start_ticks and found.state != "Z"


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    start_ticks: int


def proc_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces): state, ppid, pgrp, ... starttime.
    rest = text.rsplit(")", 1)[1].split()
    return ProcStat(pid, rest[0], int(rest[1]), int(rest[2]), int(rest[19]))


def all_proc_stats() -> list[ProcStat]:
    stats = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := proc_stat(int(entry.name))) is not None:
            stats.append(found)
    return stats
