"""Free TCP ports to name before the server that will listen on them starts.

A fleet writes every broker's URL into its topology before any broker runs, so the port must be
chosen first and bound later. The usual trick, binding port 0 and closing the socket, hands out
a port from the kernel's *ephemeral* range, which the kernel keeps handing out: to any other
socket that binds port 0 (an embedded MQTT broker, a test server) and to outgoing connections.
One of those can take the port between our choice and the bind; the broker then fails to start
with "address already in use".

:func:`free_port` therefore picks below the ephemeral range, where only explicit binds land,
probes that the port is free now, and never hands out the same port twice in one process, nor,
for a minute, one that another process of the same user handed out (:func:`_reserve`: a file of
the user's reservations, locked while read and written). Processes of two users choosing at
once could still meet; they start from independent random points in a range of several thousand
ports, and ``fleet up`` says so if they did (:func:`gbroker.fleet.members.wait_port`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import stat
import threading
import time
from pathlib import Path

__all__ = [
    "free_port",
]

_LOWEST = 20_000
"""The first port we use: above the well-known and most registered service ports."""

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL_DEFAULT = 32_768
"""Linux's default start of the ephemeral range, used when the range cannot be read."""

RESERVED_FOR = 60.0
"""How long (s) a port handed out stays reserved for the user's other processes: past the time a
server takes to start and bind it."""

_handed_out: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()  # seeded from the OS: independent in every process
# ... and in every forked one: a child that kept its parent's state would name the ports its
# parent and its siblings name (mutmut's forked workers did, and collided).
os.register_at_fork(after_in_child=_rng.seed)


def _ephemeral_start() -> int:
    """Where the kernel's ephemeral range starts: the end of ours.

    A range starting at or below 20000 (a host tuned for many outgoing connections) leaves no
    room below it; we then use 20000-32767, inside it, and collisions become possible again.
    """
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT
    return low if low > _LOWEST else _EPHEMERAL_DEFAULT


def _is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _reservations() -> str:
    """The file of this user's reservations, one for all the user's processes on the host
    (whatever ``TMPDIR`` each has): in ``$XDG_RUNTIME_DIR`` (the user's own), else ``/run``
    for root, ``/run/user/UID`` where it exists, else ``/tmp``, named after the uid."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "gbroker-ports")
    if uid == 0 and os.path.isdir("/run"):
        return "/run/gbroker-ports"
    if os.path.isdir(f"/run/user/{uid}"):
        return f"/run/user/{uid}/gbroker-ports"
    return f"/tmp/gbroker-ports-{uid}"


def _reserve(port: int, path: str | None = None) -> bool:
    """Reserve ``port`` for :data:`RESERVED_FOR` s among this user's processes; False if one
    of them holds it. Where the file cannot be used (another user's, a link, unwritable) every
    port is reservable: the reservation only makes a meeting rarer."""
    path = _reservations() if path is None else path
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return True
    with contextlib.closing(os.fdopen(fd, "r+")) as file:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode):
            return True
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.time()
        held: dict[int, float] = {}
        for line in file.read(1 << 20).splitlines():
            with contextlib.suppress(ValueError):
                number, until = line.split()
                if float(until) > now:
                    held[int(number)] = float(until)
        if port in held:
            return False
        held[port] = now + RESERVED_FOR
        file.seek(0)
        file.truncate()
        file.write("".join(f"{number} {until:.3f}\n" for number, until in held.items()))
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on IPv4 ``host``: free now, below the ephemeral range, new to this process
    and not reserved by another of the user's (:func:`_reserve`).

    Raises:
        OSError: every port between 20000 and the ephemeral range is taken or handed out.
    """
    stop = _ephemeral_start()
    span = stop - _LOWEST
    with _lock:
        start = _rng.randrange(span)
        for step in range(span):
            port = _LOWEST + (start + step) % span
            if port not in _handed_out and _is_free(host, port) and _reserve(port):
                _handed_out.add(port)
                return port
    raise OSError(f"no free TCP port on {host} between {_LOWEST} and {stop - 1}")
