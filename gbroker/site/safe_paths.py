"""Touching what a job can change, from a broker that runs as root.

Theory of operation. A job's directory belongs to the job's account, and a site's file systems
are shared by many accounts: at any moment the job, or another process of its account, may
replace any entry there with a symbolic link, a FIFO or a hard link to another file, or swap two
directories (``renameat2(RENAME_EXCHANGE)``). Root, opening such a path with its own rights,
would read, write, give away or delete whatever the entry has become. So here:

- The place a walk starts from is a directory no job can change: a job's directory (an entry of
  the broker's own job root) or a file system's mount point (the operator's). Root opens it,
  ``O_DIRECTORY | O_NOFOLLOW``, and may give it to the job's account (:func:`give_directory`).
- Everything below is reached from that descriptor one component at a time (``openat`` with
  ``O_NOFOLLOW``: a link is refused, never followed) and **with the rights of the job's
  account** (:func:`as_account`: this thread's file-system uid and gid become the account's and
  its supplementary groups none, as a job's are). Whatever a job swaps in, the kernel then lets
  the broker do there only what the job itself could: a hard link to root's file, a directory
  of another user's moved in, a file system's directory of another user are all refused
  (``PermissionError``), and what is made is the account's.
- A file is opened ``O_NONBLOCK`` (a FIFO must not hold a thread) and must then be a regular
  file (``fstat`` of what was opened, not of the name).

:func:`as_account` changes one thread's identity only (the kernel's credentials are per thread;
``setfsuid`` and a raw ``setgroups`` system call change the caller's alone, where glibc's
``setgroups`` would change every thread's), so it is for worker threads (``asyncio.to_thread``),
never around an ``await``: it refuses to run in a thread with a running event loop. A broker
that is not root runs jobs as itself: there is nothing to drop, and it changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import os
import platform
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from gbroker.errors import InvalidInput

__all__ = [
    "Account",
    "as_account",
    "create_inside",
    "directory_inside",
    "give_directory",
    "open_inside",
    "owner_of",
    "remove_inside",
]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_UNCHANGED = 0xFFFFFFFF  # (uid_t) -1: setfsuid and setfsgid then only say the current id
# setgroups(2)'s number where gid_t is 32 bits in it (glibc's wrapper acts on every thread).
_SETGROUPS = {"x86_64": 116, "aarch64": 159, "riscv64": 159, "ppc64le": 81, "s390x": 206}


class Account(NamedTuple):
    """The uid and gid a job runs as (its directory's owner)."""

    uid: int
    gid: int


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("setfsuid", "setfsgid"):
        function = getattr(libc, name)
        function.argtypes = [ctypes.c_uint32]
        function.restype = ctypes.c_int
    return libc


def _set_thread_groups(groups: list[int]) -> None:
    """This thread's supplementary groups, and no other thread's."""
    number = _SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no per-thread setgroups known on {platform.machine()}")
    array = (ctypes.c_uint32 * max(len(groups), 1))(*groups)
    if _libc().syscall(number, len(groups), array) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setgroups: {os.strerror(code)}")


@contextlib.contextmanager
def as_account(account: Account | None) -> Iterator[None]:
    """Within: this thread reaches files with the rights of ``account`` (its file-system uid and
    gid, no supplementary groups), and only it; back to its own identity after. Nothing changes
    for None, for an account that is the broker's own, or in a broker that is not root.

    Raises :class:`RuntimeError` in a thread with a running event loop (every task of the loop
    would run as the account), :class:`OSError` if the identity cannot be taken."""
    if account is None or os.geteuid() != 0 or account == (os.geteuid(), os.getegid()):
        yield
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("as_account in an event loop's thread: use a worker thread")
    libc = _libc()
    groups = os.getgroups()  # this thread's
    if groups:
        _set_thread_groups([])
    own_gid = libc.setfsgid(account.gid)
    own_uid = libc.setfsuid(account.uid)
    try:
        if (libc.setfsuid(_UNCHANGED), libc.setfsgid(_UNCHANGED)) != account:
            raise OSError(errno.EPERM, f"cannot take uid {account.uid}, gid {account.gid}")
        yield
    finally:
        libc.setfsuid(own_uid)
        libc.setfsgid(own_gid)
        if groups:
            _set_thread_groups(groups)


def owner_of(directory: Path) -> Account:
    """Who owns ``directory`` (never a link): for a job's directory, the job's account."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(directory))
    return Account(info.st_uid, info.st_gid)


def give_directory(path: Path, account: Account, mode: int = 0o700) -> None:
    """Make ``path`` (a job's directory: an entry of a directory of root's, which no job can
    change) if it is not there, and give it to ``account`` with ``mode``, through a descriptor
    opened without following a link. Its parents are made as root's if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    descriptor = os.open(path, _DIRECTORY)
    try:
        if os.geteuid() == 0:
            os.fchown(descriptor, account.uid, account.gid)
        os.fchmod(descriptor, mode)
    finally:
        os.close(descriptor)


def _parts(relative: str, *, itself: bool = False) -> list[str]:
    """The names on the way to ``relative`` (none for the directory ``itself``, if allowed)."""
    parts = [p for p in Path(relative).parts if p not in ("", ".")]
    if (not parts and not itself) or ".." in parts or Path(relative).is_absolute():
        raise InvalidInput("path", "a relative path inside its directory", relative)
    return parts


def _no_links(relative: str) -> InvalidInput:
    return InvalidInput("path", "a path through directories, not links", relative)


def _walk(base: int, parts: list[str], relative: str, create: bool, mode: int) -> int:
    """A descriptor of ``base/parts...``, reached one component at a time without following a
    link (made with ``mode`` where missing if ``create``). ``base`` stays open."""
    descriptor = os.dup(base)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=descriptor)
            try:
                inner = os.open(part, _DIRECTORY, dir_fd=descriptor)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _no_links(relative) from None
                raise
            os.close(descriptor)
            descriptor = inner
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _regular(descriptor: int, relative: str) -> int:
    """``descriptor`` made blocking, if it is a regular file; else closed and refused."""
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise InvalidInput("path", "a regular file", relative)
    os.set_blocking(descriptor, True)
    return descriptor


def _open_file(directory: Path, relative: str, account: Account | None, flags: int) -> int:
    """``relative`` under ``directory`` opened with ``flags`` as ``account`` (parents made
    0755 if ``flags`` create), nothing followed, a regular file or refused."""
    parts = _parts(relative)
    base = os.open(directory, _DIRECTORY)
    try:
        with as_account(account):
            parent = _walk(base, parts[:-1], relative, bool(flags & os.O_CREAT), 0o755)
            try:
                found = os.open(
                    parts[-1],
                    flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    0o644,
                    dir_fd=parent,
                )
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InvalidInput("path", "a regular file, not a link", relative) from None
                raise
            finally:
                os.close(parent)
    finally:
        os.close(base)
    return _regular(found, relative)


def open_inside(directory: Path, relative: str, account: Account | None = None) -> int:
    """A read-only descriptor of the regular file ``relative`` under ``directory``, opened as
    ``account`` without following any link (see the module docstring).

    Raises :class:`FileNotFoundError` for a missing file, :class:`PermissionError` for one the
    account may not read, and :class:`InvalidInput` for anything but a regular file reached
    through real directories."""
    return _open_file(directory, relative, account, os.O_RDONLY)


def create_inside(
    directory: Path, relative: str, flags: int, account: Account | None = None
) -> int:
    """A write descriptor of the file ``relative`` under ``directory``, made (0644, its parents
    0755) where missing, opened as ``account`` without following any link. ``flags`` add to
    ``O_WRONLY | O_CREAT`` (``O_TRUNC``, ``O_APPEND`` or ``O_EXCL``). Raises as
    :func:`open_inside`, and :class:`FileExistsError` for ``O_EXCL`` and a file there."""
    return _open_file(directory, relative, account, os.O_WRONLY | os.O_CREAT | flags)


def remove_inside(directory: Path, relative: str, account: Account | None = None) -> bool:
    """Delete the file ``relative`` under ``directory`` as ``account`` (a link is removed, never
    followed); False if it was not there."""
    parts = _parts(relative)
    base = os.open(directory, _DIRECTORY)
    try:
        with as_account(account):
            try:
                parent = _walk(base, parts[:-1], relative, False, 0)
            except FileNotFoundError:
                return False
            try:
                os.unlink(parts[-1], dir_fd=parent)
            except FileNotFoundError:
                return False
            finally:
                os.close(parent)
    finally:
        os.close(base)
    return True


def directory_inside(
    directory: Path,
    relative: str,
    account: Account | None = None,
    *,
    create: bool = False,
    mode: int = 0o755,
) -> int:
    """A descriptor of the directory ``relative`` under ``directory`` (``"."``: itself; made
    with ``mode`` where missing if ``create``), reached as ``account`` without following any
    link. Whatever is done through it afterwards (``dir_fd=``) must be done :func:`as_account`
    too."""
    parts = _parts(relative, itself=True)
    base = os.open(directory, _DIRECTORY)
    try:
        with as_account(account):
            return _walk(base, parts, relative, create, mode)
    finally:
        os.close(base)
