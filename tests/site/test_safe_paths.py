"""gbroker.site.safe_paths: paths under a directory a job can change, walked without following a
link and, under a root broker, with the job's account's rights in this thread alone. Real files;
as root the job's account is nobody."""

from __future__ import annotations

import asyncio
import os
import pwd
import threading
from pathlib import Path

import pytest

from gbroker.errors import InvalidInput
from gbroker.site.safe_paths import (
    Account,
    as_account,
    create_inside,
    directory_inside,
    give_directory,
    open_inside,
    owner_of,
    remove_inside,
)

ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody")
JOB = Account(NOBODY.pw_uid, NOBODY.pw_gid) if ROOT else Account(os.geteuid(), os.getegid())
as_root = pytest.mark.skipif(not ROOT, reason="the job's account is the broker's own")


def test_create_inside_makes_parents_and_follows_no_planted_link(tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("keep")
    fd = create_inside(shared, "a/b/c.txt", os.O_TRUNC)
    os.write(fd, b"x")
    os.close(fd)
    assert (shared / "a" / "b" / "c.txt").read_text() == "x"
    (shared / "link.txt").symlink_to(secret)  # another job planted it
    with pytest.raises(InvalidInput, match="not a link"):
        create_inside(shared, "link.txt", os.O_TRUNC)
    (shared / "dir").symlink_to(tmp_path)
    with pytest.raises(InvalidInput, match="through directories"):
        create_inside(shared, "dir/secret", os.O_TRUNC)
    assert secret.read_text() == "keep"
    with pytest.raises(FileExistsError):
        create_inside(shared, "a/b/c.txt", os.O_EXCL)
    assert remove_inside(shared, "link.txt")  # the link goes, not what it points to
    assert secret.exists()
    assert not remove_inside(shared, "a/none")
    with pytest.raises(InvalidInput):
        create_inside(shared, "../escape", os.O_TRUNC)


def test_a_fifo_is_neither_waited_on_nor_taken_for_a_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidInput, match="a regular file"):  # nobody writes it: no wait
        open_inside(tmp_path, "fifo")
    with pytest.raises(OSError, match="No such device"):  # nobody reads it: ENXIO, no wait
        create_inside(tmp_path, "fifo", os.O_APPEND)
    reader = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(InvalidInput, match="a regular file"):
            create_inside(tmp_path, "fifo", os.O_APPEND)
    finally:
        os.close(reader)


@as_root
def test_files_are_made_read_and_removed_with_the_accounts_rights(tmp_path: Path) -> None:
    give_directory(tmp_path / "job", JOB)
    assert owner_of(tmp_path / "job") == JOB
    fd = create_inside(tmp_path / "job", "out/result", os.O_TRUNC, JOB)
    os.close(fd)
    for made in ("out", "out/result"):
        info = (tmp_path / "job" / made).stat()
        assert (info.st_uid, info.st_gid) == JOB
    secret = tmp_path / "job" / "secret"  # root's, in the job's directory: a hard link, say
    secret.write_text("root's")
    secret.chmod(0o600)
    with pytest.raises(PermissionError):
        open_inside(tmp_path / "job", "secret", JOB)
    with pytest.raises(PermissionError):
        create_inside(tmp_path / "job", "secret", os.O_APPEND, JOB)
    closed = tmp_path / "job" / "closed"  # a directory of root's the job cannot write
    closed.mkdir(mode=0o755)
    (closed / "kept").write_text("root's")
    with pytest.raises(PermissionError):
        remove_inside(tmp_path / "job", "closed/kept", JOB)
    with pytest.raises(PermissionError):
        directory_inside(tmp_path / "job", "closed/new", JOB, create=True)
    assert (closed / "kept").exists()
    os.close(open_inside(tmp_path / "job", "secret"))  # the broker's own rights: None
    assert remove_inside(tmp_path / "job", "out/result", JOB)


@as_root
def test_the_accounts_rights_are_this_threads_alone_and_given_back(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    inside, outside = threading.Event(), threading.Event()
    seen: list[str] = []

    def as_the_job() -> None:
        with as_account(JOB):
            try:
                secret.read_text()
            except PermissionError:
                seen.append("denied in the thread")
            inside.set()
            outside.wait(5)
        seen.append(secret.read_text())  # its own rights again

    thread = threading.Thread(target=as_the_job)
    thread.start()
    assert inside.wait(5)
    seen.append(secret.read_text())  # meanwhile, this thread is still root
    outside.set()
    thread.join(5)
    assert seen == ["denied in the thread", "root's", "root's"]


@as_root
def test_supplementary_groups_are_dropped_and_given_back(tmp_path: Path) -> None:
    """A root broker's groups (root's) would open group-readable files to the job."""
    grouped = tmp_path / "grouped"
    grouped.write_text("root's group's")
    grouped.chmod(0o640)  # root:root
    seen: list[object] = []

    def in_a_thread() -> None:
        os.setgroups([0])  # glibc: every thread's; the test's main thread holds none after
        try:
            with as_account(JOB):
                seen.append(os.getgroups())
                try:
                    grouped.read_text()
                except PermissionError:
                    seen.append("denied")
            seen.append(os.getgroups())
        finally:
            os.setgroups([])

    before = os.getgroups()
    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(5)
    os.setgroups(before)
    assert seen == [[], "denied", [0]]


@as_root
@pytest.mark.asyncio
async def test_the_accounts_rights_are_never_taken_in_the_event_loops_thread(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError, match="worker thread"), as_account(JOB):
        pass
    give_directory(tmp_path / "job", JOB)
    fd = await asyncio.to_thread(create_inside, tmp_path / "job", "made", os.O_TRUNC, JOB)
    os.close(fd)
    assert (tmp_path / "job" / "made").stat().st_uid == JOB.uid


def test_directory_inside_reaches_the_directory_itself_and_refuses_links(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for relative in (".", "", "real"):
        os.close(directory_inside(tmp_path, relative))
    with pytest.raises(InvalidInput, match="not links"):
        directory_inside(tmp_path, "link/below", create=True)
    assert not (tmp_path / "real" / "below").exists()
    with pytest.raises(InvalidInput):
        directory_inside(tmp_path, "../up")
