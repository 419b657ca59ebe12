"""A moving job's bundle: its checkpoint image and its directory as one tar, made and taken
apart so that root never follows a path a job can change.

Theory of operation. A job's directory is the job's: while it is packed, the job itself (frozen,
but a thread of it may have run until the freeze) or any other process of the same user at the
site can replace an entry of it with a link, a FIFO or a directory swapped in by
``renameat2(RENAME_EXCHANGE)``. So root does not read it:

- :func:`pack`: root writes the image (a directory of root's, which no job reaches) with
  :mod:`tarfile`, then **GNU tar, run as the job's own account**, writes the job's directory
  after it (``--sparse``: a sparse file stays sparse), its output streamed into the bundle by
  root, which counts it against the cap. Whatever the job swaps, the bundle holds only what its
  account could read. The two parts are two tar archives one after the other (read with
  ``ignore_zeros``): members ``image/...`` then ``job/...``.
- The bundle's **cap** (the site's, by default its file store's) counts files at their apparent
  size (a 3 GiB sparse file counts 3 GiB), checked from the members' headers at both ends: a
  move over it is refused, the job running on (:class:`BundleTooLarge`).
- :func:`unpack` (at the target, root): every member checked (names under ``image`` and ``job``
  only, the sum of apparent sizes within the target's own cap), then extracted with tarfile's
  ``data`` filter (no path outside, no device, no set-id bit; sparse members stay sparse) into a
  directory of root's that no job reaches. :func:`place` gives the job's tree to its account
  there, where no job can swap anything under root's walk, then renames it into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "IMAGE",
    "JOB",
    "BundleError",
    "BundleTooLarge",
    "pack",
    "place",
    "staged_job",
    "unpack",
]

IMAGE = "image"
"""The bundle's members of the checkpoint image, and the image's directory where it is unpacked."""
JOB = "job"
"""The bundle's members of the job's directory, and where :func:`unpack` stages them."""
QUIET_FOR = 30.0
"""Seconds the packing tar may go without writing before it is taken for stuck (a process of
the job's user can stop it: it runs as that user) and killed."""
_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle could not be made or taken apart; the message says why, for people."""


class BundleTooLarge(BundleError):
    """A bundle over its cap."""


def _over(what: str, size: int, cap: int) -> BundleTooLarge:
    return BundleTooLarge(
        f"{what} holds {size} bytes (files counted at their apparent size), over the "
        f"bundle cap of {cap} bytes (--max-bundle)"
    )


def _account_options(account: tuple[int, int] | None) -> dict[str, object]:
    if account is None or os.geteuid() != 0:
        return {}
    uid, gid = account
    return {"user": uid, "group": gid, "extra_groups": []}


async def pack(
    bundle: Path, image: Path, job_dir: Path, account: tuple[int, int] | None, cap: int
) -> tuple[str, int]:
    """Write ``bundle`` (a new file) from a checkpoint's ``image`` (root's) and the job's
    directory ``job_dir``, read as ``account`` (uid, gid; None: as ourselves); its sha256 and
    size. :class:`BundleTooLarge` over ``cap`` bytes, :class:`BundleError` if the job's
    directory cannot be read; no bundle is left then."""
    try:
        return await _pack(bundle, image, job_dir, account, cap)
    except BaseException:
        with contextlib.suppress(OSError):
            bundle.unlink()
        raise


async def _pack(
    bundle: Path, image: Path, job_dir: Path, account: tuple[int, int] | None, cap: int
) -> tuple[str, int]:
    fd = os.open(bundle, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        await asyncio.to_thread(_write_image, out, image)
        written = out.tell()
        if written > cap:
            raise _over("the checkpoint image", written, cap)
        await _write_job(out, job_dir, account, cap - written)
    total = await asyncio.to_thread(_apparent_size, bundle)
    if total > cap:
        raise _over(f"job {job_dir.name}'s bundle", total, cap)
    return await asyncio.to_thread(_digest, bundle)


def _write_image(out: IO[bytes], image: Path) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(image, arcname=IMAGE)


async def _write_job(
    out: IO[bytes], job_dir: Path, account: tuple[int, int] | None, room: int
) -> None:
    """GNU tar of ``job_dir`` as ``account``, its members named ``job/...``, appended to
    ``out``; at most ``room`` bytes of it."""
    process = await asyncio.create_subprocess_exec(
        "tar",
        "--create",
        "--sparse",
        "--format=gnu",
        "--numeric-owner",
        "--file=-",
        f"--directory={job_dir}",
        # Members "job", "job/...": links' targets are left as the job wrote them.
        r"--transform=s,^\.,job,S",
        ".",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        **_account_options(account),  # type: ignore[arg-type]
    )
    assert process.stdout is not None
    assert process.stderr is not None
    errors = asyncio.ensure_future(_tail(process.stderr))
    got = 0
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(process.stdout.read(_CHUNK), QUIET_FOR)
            except TimeoutError:
                raise BundleError(
                    f"packing {job_dir} wrote nothing for {QUIET_FOR:g} s (stopped?)"
                ) from None
            if not chunk:
                break
            got += len(chunk)
            if got > room:
                raise _over(f"job {job_dir.name}'s directory", got, room)
            await asyncio.to_thread(out.write, chunk)
        code = await process.wait()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        said = (await errors).decode(errors="replace").strip()
    # 1: a file changed while it was read (the job is frozen; another process of its user
    # may still write): the bundle holds what was read.
    if code not in (0, 1):
        raise BundleError(f"packing {job_dir} failed (tar exit {code}): {said[-300:]}")


async def _tail(stream: asyncio.StreamReader, keep: int = 4096) -> bytes:
    """What ``stream`` says until its end, its last ``keep`` bytes."""
    said = b""
    while chunk := await stream.read(1 << 16):
        said = (said + chunk)[-keep:]
    return said


def _part(name: str) -> str | None:
    for part in (IMAGE, JOB):
        if name == part or name.startswith(part + "/"):
            return part
    return None


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members, each under ``image/`` or ``job/``, the image's first: the job's part is
    written by a process of the job's user (which another of its processes may trace), so it
    may say anything, but never a member of the image's, which root wrote before it."""
    seen = IMAGE
    for member in tar:
        part = _part(member.name)
        if part is None:
            raise BundleError(
                f"bundle: expected members under {IMAGE}/ and {JOB}/, got {member.name!r}"
            )
        if part == IMAGE and seen == JOB:
            raise BundleError(f"bundle: {member.name!r} after the job's members")
        seen = part
        yield member


def _apparent_size(bundle: Path) -> int:
    """The bundle's files at their apparent sizes (a sparse member's full length)."""
    with tarfile.open(bundle, "r:", ignore_zeros=True) as tar:
        return sum(member.size for member in _members(tar) if member.isfile())


def _digest(bundle: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with bundle.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest(), bundle.stat().st_size


def _safe_member(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter (nothing outside, no device, no set-id bit, no hard link to a
    file outside), but a symbolic link may name anything (``tar``'s filter: a link is only
    text, and nothing is extracted through one out of the directory), and each member keeps its
    own permission bits: CRIU restores a job only if its files and directories have the modes
    they had (a job directory 0700 came out 0755 with the filter's defaults)."""
    safe = (tarfile.tar_filter if member.issym() else tarfile.data_filter)(member, path)
    return safe.replace(mode=member.mode & 0o777, deep=False)


def unpack(bundle: Path, into: Path, cap: int) -> Path:
    """Take ``bundle`` apart into ``into`` (a directory of root's that no job reaches):
    ``into/image`` (the checkpoint) and ``into/job`` (the job's directory, staged for
    :func:`place`); the image's path. :class:`BundleTooLarge` over ``cap`` bytes at apparent
    sizes, :class:`BundleError` for members out of place."""
    staging = into / "unpacked"
    shutil.rmtree(staging, ignore_errors=True)
    total = _apparent_size(bundle)
    if total > cap:
        raise _over("the bundle", total, cap)
    staging.mkdir(mode=0o700)
    with tarfile.open(bundle, "r:", ignore_zeros=True) as tar:
        members = list(_members(tar))
        try:
            tar.extractall(staging, members=members, filter=_safe_member, numeric_owner=True)
        except KeyError as exc:  # a hard link to no member before it
            raise BundleError(f"bundle: {exc.args[0]}") from None
    for part in (IMAGE, JOB):
        shutil.rmtree(into / part, ignore_errors=True)
        if not (staging / part).is_dir():
            raise BundleError(f"bundle: no {part}/ in it")
        os.replace(staging / part, into / part)
    shutil.rmtree(staging, ignore_errors=True)
    return into / IMAGE


def staged_job(image: Path) -> Path:
    """Where :func:`unpack` staged the job's directory beside ``image``."""
    return image.parent / JOB


def place(staged: Path, job_dir: Path, uid: int, gid: int) -> None:
    """Give the staged job directory to ``uid``/``gid`` (under root's directory, where no job
    swaps anything while root walks it; links are changed, never followed), then move it to
    ``job_dir`` (an older directory there removed, by descriptors)."""
    if os.geteuid() == 0:
        for parent, directories, files in os.walk(staged):
            for name in (*directories, *files):
                os.lchown(os.path.join(parent, name), uid, gid)
        os.lchown(staged, uid, gid)
    info = os.lstat(staged)
    if not stat.S_ISDIR(info.st_mode):
        raise BundleError(f"{staged}: expected the staged job directory")
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, job_dir)
