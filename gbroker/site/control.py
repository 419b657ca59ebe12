"""Reaching a job's control socket safely (:mod:`gbroker.app.malleable`'s channel).

Whose socket. The broker may be root, and the job's directory is the job's: it could put there a
link to another socket (a launcher's, root's) and have the broker connect to it. So the site
connects only to a socket that is the job's own (:func:`open_control`): the name is opened
``O_PATH | O_NOFOLLOW`` under the job directory's descriptor (itself opened ``O_NOFOLLOW``), which
pins the inode: it must be a socket (a link is refused, not followed), owned by the job's uid;
the connection goes to that very inode (``/proc/self/fd/N``), so nothing can be swapped in
between; and the listening peer's credentials (``SO_PEERCRED``) must be the job's uid and a
process of the job's process group. Anything else is :class:`ControlRefused`, naming what it was.

Both users of the channel connect through here: the resize link (:mod:`.resize`) and the
application-level checkpoints (:mod:`.appstate`). A job serves several connections at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
from pathlib import Path

__all__ = ["ControlRefused", "open_control", "process_ids"]


class ControlRefused(OSError):
    """A job's control socket that is not the job's own (a link, another's socket, another
    process listening): never used."""


def process_ids(pid: int) -> tuple[int, int] | None:
    """A live process's real uid and process group, from /proc; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), None)
    return None if uid is None else (int(uid), int(fields[2]))


async def open_control(
    job_id: str, path: Path, leader: int | None, limit: int = 2**16
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to job ``job_id``'s own socket at ``path`` (see the module docs), its
    process group led by ``leader`` (None: the job does not run); or :class:`ControlRefused`,
    or the OSError of a socket nobody listens on. ``limit``: the longest line the reader takes."""
    job = None if leader is None else process_ids(leader)
    if leader is None or job is None:
        raise FileNotFoundError(f"job {job_id} does not run")
    uid, group = job[0], leader
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        # The name itself, never what it links to: fstat then tells a link from a socket.
        pinned = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    finally:
        os.close(directory)
    try:
        info = os.fstat(pinned)
        if not stat.S_ISSOCK(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a socket"
            raise ControlRefused(f"{path} is {kind}")
        if info.st_uid != uid:
            raise ControlRefused(f"{path} belongs to uid {info.st_uid}, not the job's {uid}")
        # To that very inode (the descriptor's path is also short: sun_path holds 107 bytes).
        reader, writer = await asyncio.open_unix_connection(f"/proc/self/fd/{pinned}", limit=limit)
    finally:
        os.close(pinned)
    connection: socket.socket = writer.get_extra_info("socket")
    pid, peer_uid, _ = struct.unpack(
        "3i",
        connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")),
    )
    peer = process_ids(pid)
    if peer_uid != uid or peer is None or peer[1] != group:
        writer.close()
        raise ControlRefused(
            f"{path} is listened on by pid {pid} (uid {peer_uid}), not by a process of "
            f"the job's group {group} (uid {uid})"
        )
    return reader, writer
