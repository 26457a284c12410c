"""Listening TCP sockets of a process tree and this machine's addresses, from /proc (Linux).

Used by the network-exposure tests: which addresses do the processes of *one* Ray session
listen on, and can a client reach them through a non-loopback address of the machine.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp*
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class ListeningSocket:
    """One listening TCP socket and the process holding it."""

    pid: int
    process: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback_only(self) -> bool:
        """True for 127.0.0.0/8, ::1 and ::ffff:127.x (never for 0.0.0.0 / ::)."""
        address = self.address
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        return f"{self.process}[{self.pid}] on {self.address}:{self.port}"


def _parse_address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port, 16)
    # /proc prints IPv6 as four host-order 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words), int(port, 16)


def _listening_by_inode() -> dict[int, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] == _LISTEN:
                    found[int(fields[9])] = _parse_address(fields[1])
    return found


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (by parent PID), as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def process_name(pid: int) -> str:
    """The process's command line, shortened, its program by base name (``gcs_server ...``).

    The base name keeps the program visible however long the install path (a CI venv under
    /tmp); the comm is used if the command line is unreadable.
    """
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        args = [a for a in args if a]
        if not args:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        return " ".join([Path(args[0]).name, *args[1:]])[:80]
    except OSError:
        return "?"


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def exposed_listeners_outside(pids: list[int], port: int) -> list[str]:
    """Non-loopback listeners on ``port`` held by processes *not* among ``pids``.

    A connection through an outside address to such a port reaches that other program (another
    Ray on a shared machine binds Ray's default ports on every interface), not this session.
    """
    own = _socket_inodes(pids)
    found = []
    for inode, (address, listen_port) in _listening_by_inode().items():
        if listen_port != port or inode in own:
            continue
        probe = ListeningSocket(0, "", address, listen_port)
        if not probe.loopback_only:
            found.append(f"{address}:{listen_port} (socket inode {inode})")
    return found


def listening_sockets(pids: list[int]) -> list[ListeningSocket]:
    """Every listening TCP socket held by one of ``pids``."""
    by_inode = _listening_by_inode()
    found = []
    for pid in pids:
        for inode in _socket_inodes([pid]):
            if inode in by_inode:
                address, port = by_inode[inode]
                found.append(ListeningSocket(pid, process_name(pid), address, port))
    return sorted(set(found), key=lambda s: (s.port, s.pid))


def non_loopback_ipv4_addresses() -> list[str]:
    """The machine's IPv4 addresses that are not loopback (one per interface that has one)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address on this interface
            address = socket.inet_ntoa(reply[20:24])
            if not ipaddress.IPv4Address(address).is_loopback:
                found.append(address)
    return found


def connect_outcome(host: str, port: int) -> str:
    """``"refused"``, ``"connected"`` or the error's name, connecting to ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=3).close()
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__
    return "connected"


def exposure_loop(config: dict) -> None:
    """The exposure test's training loop (runs on the Ray workers, imported by reference).

    Rank 0 writes ``store-<attempt>`` (its pid and the rendezvous port) once the process group
    is up and waits for the test's poller to answer with ``seen-<attempt>``, so the sockets
    of each attempt are sampled while they listen. Rank 1 fails at step 2 of attempt 0, so
    Ray Train restarts the group (attempt 1: a new process group, a new store).
    """
    import time

    import torch
    import torch.nn.functional as F

    import raytrain_hetero as rh

    out = Path(config["out"])
    attempt = 1 if (out / "failed").exists() else 0
    torch.manual_seed(0)
    model = rh.prepare_model(torch.nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = rh.get_rank_info()["rank"]
    if rank == 0:
        (out / f"store-{attempt}").write_text(f"{os.getpid()} {os.environ['MASTER_PORT']}")
        deadline = time.monotonic() + 60
        while not (out / f"seen-{attempt}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g)
    )
    for x, y in rh.prepare_data_loader(data):
        if attempt == 0 and rank == 1 and rh.current_step_number() == 2:
            (out / "failed").touch()
            raise RuntimeError("injected failure: the group restarts")
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    rh.report({"attempt": attempt})
