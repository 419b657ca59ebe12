"""Staging: a job's files in before it starts, out after it ends, and its file systems.

Theory of operation. A job's DataStaging entries name files of its working directory, or of a
site *file system* (JSDL's ``FilesystemName``), with where they come from and go to. The
:class:`Stager` is the site's room for all of it:

* **At submission** (the owner, before the job is durable): :meth:`Stager.check` refuses any
  source the broker would never fetch and any target it cannot deliver to (the pure checks of
  :mod:`gbroker.jobs.admission`, which ``gbroker jsdl check`` runs too), and
  :meth:`Stager.learn_sizes` learns each external input's size, so F(j)'s transfer term t_j
  counts it.
* **Stage in** (the executing site, before the job is queued): every input is fetched (or
  written, if inline) in document order, as its CreationFlag says.
* **As the job's account.** A job's directory is its account's and a file system is shared by
  many: either may hold a link, a FIFO or another user's file by the time the stager looks. So
  everything under them is made, read and deleted through :mod:`gbroker.site.safe_paths`, one
  component at a time, following no link, with the rights of the job's account: the stager may
  do there only what the job itself could.
* **File systems**: a path relative to a site's file system is made concrete here
  (:meth:`Stager.localize`), through a link in the job directory to the mount point, so the
  launcher, which keeps every path inside the job directory, writes there.
* **Stage out** (after the program ends on its own; not after a cancellation or a failed
  launch): each target gets its file, then ``DeleteOnTermination`` is honoured; a failed
  delivery fails the job, saying which entry and why. A **staging-only** job stages in, then
  out, and that is its run.

The schemes, CreationFlags and file-system paths in full: docs/JSDL.md ("File systems",
"Staging"); the account's rights: docs/SECURITY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from ssl import SSLContext

import aiohttp

from gbroker.core.requirements import FileSystemSpec
from gbroker.daemon.files import FileStore
from gbroker.daemon.peers import PeerClient
from gbroker.daemon.urls import (
    SourceKind,
    TargetKind,
    check_source,
    check_target,
    deliver,
    exists,
    fetch,
    head_size,
)
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.jobs.admission import staging_field, staging_refusals
from gbroker.jobs.description import CreationFlag, JobDescription, StagingEntry
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

__all__ = ["LINK_DIR", "MAX_STAGING_ERROR_CHARS", "Stager", "staging_field"]

log = logging.getLogger("gbroker.daemon")

LINK_DIR = ".gbroker-fs"
"""The directory of a job's directory that holds a link to each file system it uses."""
MAX_STAGING_ERROR_CHARS = 400
# HEAD requests at once for one submission (a sweep may name hundreds of inputs).
_HEADS_AT_ONCE = 16


class Stager:
    """One site's staging and file systems (see the module docstring).

    ``job_dir(job_id)`` is a job's directory; ``owner_for(submitter)`` the account its jobs run
    as here (a submitter of None: the site's default one); ``file_systems`` the site's own;
    ``store`` its file store and ``outputs`` where it records what each job staged out to it;
    ``downloads`` a directory of the broker's alone, where inputs are fetched before they are
    placed (None: the system's temporary directory).
    """

    def __init__(
        self,
        job_dir: Callable[[str], Path],
        peers: PeerClient,
        *,
        owner_for: Callable[[str | None], Account],
        allow_private: bool,
        max_bytes: int,
        ssl: Callable[[], SSLContext | None] = lambda: None,
        file_systems: Sequence[FileSystemSpec] = (),
        store: FileStore | None = None,
        outputs: Path | None = None,
        downloads: Path | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.owner_for = owner_for
        self.peers = peers
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.ssl = ssl
        self.file_systems = {fs.name: fs for fs in file_systems}
        self.store = store
        self.outputs = outputs
        self.downloads = downloads

    # -- at submission -------------------------------------------------------------------------

    def check(self, desc: JobDescription, *, xml: bool = False) -> None:
        """Refuse what no broker would stage: a source it never fetches, a target it cannot
        deliver to (both named with their scheme), or an ``append`` to a target
        (:func:`gbroker.jobs.admission.staging_refusals`, the first of them)."""
        for refusal in staging_refusals(
            desc, xml=xml, allow_private=self.allow_private, peers=self.peers.peers
        ):
            raise refusal

    async def learn_sizes(
        self, descs: Sequence[JobDescription], *, xml: bool = False
    ) -> list[JobDescription]:
        """``descs`` with each fetched input's size (z_l) and, for a peer's store, its site
        (h_l) filled in where the descriptions left them out (each URL asked once, for all the
        elements of an array). A source that answers that its file is not there is an error
        (the job could never stage); one that does not answer keeps its size unknown."""
        wanted: dict[str, int] = {}
        for desc in descs:
            for index, entry in enumerate(desc.staging):
                if entry.source is not None and entry.inline_data is None and entry.size is None:
                    wanted.setdefault(entry.source, index)
        if not wanted:
            return list(descs)
        gate = asyncio.Semaphore(_HEADS_AT_ONCE)

        async def size_of(url: str, index: int) -> tuple[str, int | None, str | None]:
            field = staging_field(index, "source", xml)
            source = check_source(
                url, allow_private=self.allow_private, peers=self.peers.peers, field=field
            )
            if source.kind is SourceKind.PEER and source.site == self.peers.site:
                assert source.sha256 is not None
                path = self.store.path(source.sha256) if self.store else None
                if path is None or not path.is_file():
                    raise InvalidInput(field, "a file in this broker's store", url)
                return url, path.stat().st_size, source.site
            signature = None
            if source.kind is SourceKind.PEER:
                signature = self.peers.headers("HEAD", str(source.url))
            async with gate:
                try:
                    size = await head_size(
                        source,
                        allow_private=self.allow_private,
                        peer_headers=signature,
                        field=field,
                        ssl=self.ssl(),
                    )
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.info("%s: no size for %s (%s)", self.peers.site, url[:200], exc)
                    size = None
            return url, size, source.site

        learned = {
            url: (size, site)
            for url, size, site in await asyncio.gather(
                *(size_of(url, index) for url, index in wanted.items())
            )
        }

        def filled(entry: StagingEntry) -> StagingEntry:
            if entry.source not in learned or entry.inline_data is not None:
                return entry
            if entry.size is not None:
                return entry
            size, site = learned[entry.source]
            return dataclasses.replace(entry, size=size, site=entry.site or site)

        return [
            dataclasses.replace(desc, staging=tuple(filled(e) for e in desc.staging))
            for desc in descs
        ]

    # -- file systems --------------------------------------------------------------------------

    def mount(self, name: str) -> Path:
        """Where this site's file system ``name`` is mounted (it must exist here)."""
        fs = self.file_systems.get(name)
        if fs is None:
            known = ", ".join(sorted(self.file_systems)) or "none"
            raise InvalidInput(
                f"file system {name}", f"a file system of site {self.peers.site} ({known})", name
            )
        return Path(fs.mount)

    @staticmethod
    def _used(desc: JobDescription) -> list[str]:
        names = [*desc.filesystem_names.values(), *(e.filesystem for e in desc.staging)]
        return list(dict.fromkeys(n for n in names if n is not None))

    def localize(self, desc: JobDescription) -> JobDescription:
        """``desc`` with its file-system-relative paths made concrete for this site (see the
        module docstring); unchanged when it uses no file system. Pure: the links are made
        by :meth:`stage_in`."""
        used = self._used(desc)
        if not desc.filesystem_names and not used:
            return desc
        changes: dict[str, object] = {}
        arguments = list(desc.arguments)
        environment = dict(desc.environment)
        for key, name in desc.filesystem_names.items():
            mount = self.mount(name)
            if key in ("input", "output", "error", "working_directory"):
                changes[key] = f"{LINK_DIR}/{name}/{getattr(desc, key)}"
            elif key == "executable":
                changes[key] = str(mount / str(desc.executable))
            elif key.startswith("arguments["):
                index = int(key[len("arguments[") : -1])
                arguments[index] = str(mount / arguments[index])
            else:
                variable = key.removeprefix("environment.")
                environment[variable] = str(mount / environment[variable])
        for name in used:
            mount = self.mount(name)  # each must be this site's
            if not desc.staging_only:  # a program to tell where its file systems are
                environment.setdefault(f"GBROKER_FS_{name}", str(mount))
        return dataclasses.replace(
            desc,
            arguments=tuple(arguments),
            environment=environment,
            filesystem_names={},
            **changes,  # type: ignore[arg-type]
        )

    def _link_file_systems(self, directory: Path, names: Iterable[str], account: Account) -> None:
        """``LINK_DIR/<name>`` in the job's directory, a link to each file system's mount point,
        made as the job's account (its directory may hold anything by that name)."""
        mounts = {name: self.mount(name) for name in names}
        for name, mount in mounts.items():
            if not mount.is_dir():
                raise InvalidInput(
                    f"file system {name}",
                    f"its mount point {mount} to be a directory at site {self.peers.site}",
                    "missing",
                )
        if not mounts:
            return
        links = directory_inside(directory, LINK_DIR, account, create=True)
        try:
            with as_account(account):
                for name, mount in mounts.items():
                    with contextlib.suppress(OSError):  # none yet, or not a link
                        if os.readlink(name, dir_fd=links) == str(mount):
                            continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=links)
                    os.symlink(mount, name, target_is_directory=True, dir_fd=links)
        finally:
            os.close(links)

    def _base(self, directory: Path, entry: StagingEntry) -> Path:
        return self.mount(entry.filesystem) if entry.filesystem else directory

    # -- stage in ------------------------------------------------------------------------------

    async def stage_in(
        self, job_id: str, desc: JobDescription, submitter: str | None = None
    ) -> JobDescription:
        """Fetch a job's inputs (see the module docstring) as the account ``submitter``'s jobs
        run as; the description the job runs with here (:meth:`localize`)."""
        account = self.owner_for(submitter)
        directory = self.job_dir(job_id)
        used = self._used(desc)
        if desc.stage_in or used:  # else the launcher makes it at launch
            await asyncio.to_thread(self._prepare, directory, desc, used, account)
        downloads: tempfile.TemporaryDirectory[str] | None = None
        try:
            for index, entry in enumerate(desc.staging):
                if not entry.stages_in:
                    continue
                base = self._base(directory, entry)
                field = staging_field(index, "source", False)
                if entry.inline_data is not None:
                    data = entry.inline_data.encode()
                    await asyncio.to_thread(self._place_bytes, base, entry, data, index, account)
                    continue
                source = check_source(
                    entry.source,
                    allow_private=self.allow_private,
                    peers=self.peers.peers,
                    field=field,
                )
                signature = None
                if source.kind is SourceKind.PEER:
                    signature = self.peers.headers("GET", str(source.url))
                if downloads is None:
                    downloads = await asyncio.to_thread(self._downloads)
                partial = Path(downloads.name) / str(index)
                await fetch(
                    source,
                    partial,
                    max_bytes=self.max_bytes,
                    allow_private=self.allow_private,
                    peer_headers=signature,
                    field=field,
                    ssl=self.ssl(),
                )
                try:
                    await asyncio.to_thread(self._place_file, base, entry, partial, index, account)
                finally:
                    partial.unlink(missing_ok=True)
        finally:
            if downloads is not None:
                await asyncio.to_thread(downloads.cleanup)
        return self.localize(desc)

    def _prepare(
        self, directory: Path, desc: JobDescription, used: list[str], account: Account
    ) -> None:
        """The job's directory, its account's; its file systems' links; and nothing of an
        earlier attempt's inputs."""
        give_directory(directory, account)
        self._link_file_systems(directory, used, account)
        # Staged again after a restart: what an earlier attempt left in the job's own directory
        # must not be appended to, nor count as there (dontOverwrite).
        for entry in desc.stage_in:
            if entry.filesystem is None:
                remove_inside(directory, entry.file_name, account)

    def _downloads(self) -> tempfile.TemporaryDirectory[str]:
        """A new directory (0700) of the broker's alone, where a job's inputs are fetched: out
        of the job's reach (a download into its directory went wherever a link it planted
        there pointed)."""
        if self.downloads is not None:
            self.downloads.mkdir(mode=0o700, parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix="stage-", dir=self.downloads)

    @staticmethod
    def _flags(entry: StagingEntry) -> int:
        return {
            CreationFlag.OVERWRITE: os.O_TRUNC,
            CreationFlag.APPEND: os.O_APPEND,
            CreationFlag.DONT_OVERWRITE: os.O_EXCL,
        }[entry.creation_flag]

    def _open_for(self, base: Path, entry: StagingEntry, index: int, account: Account) -> int:
        try:
            return create_inside(base, entry.file_name, self._flags(entry), account)
        except FileExistsError:
            raise InvalidInput(
                f"staging[{index}]",
                f"no file {entry.file_name} there yet (its CreationFlag is dontOverwrite)",
                "it exists",
            ) from None

    def _place_bytes(
        self, base: Path, entry: StagingEntry, data: bytes, index: int, account: Account
    ) -> None:
        with os.fdopen(self._open_for(base, entry, index, account), "wb") as out:
            out.write(data)

    def _place_file(
        self, base: Path, entry: StagingEntry, partial: Path, index: int, account: Account
    ) -> None:
        with (
            os.fdopen(self._open_for(base, entry, index, account), "wb") as out,
            partial.open("rb") as src,
        ):
            while chunk := src.read(1 << 16):
                out.write(chunk)

    # -- stage out -----------------------------------------------------------------------------

    async def stage_out(
        self, job_id: str, desc: JobDescription, submitter: str | None = None
    ) -> str | None:
        """Deliver a job's outputs, then delete its DeleteOnTermination files, as the account
        ``submitter``'s jobs run as; None if all went well, else what went wrong (each entry is
        tried)."""
        directory = self.job_dir(job_id)
        try:
            account = self.owner_for(submitter)
        except GBrokerError as exc:
            return f"stage-out: {exc}"[:MAX_STAGING_ERROR_CHARS]
        problems: list[str] = []
        stored: dict[str, dict[str, object]] = {}
        for index, entry in enumerate(desc.staging):
            if entry.target is None:
                continue
            try:
                await self._deliver(directory, entry, index, stored, account)
            except (GBrokerError, OSError, aiohttp.ClientError, TimeoutError) as exc:
                problems.append(f"stage-out of staging[{index}] ({entry.file_name}): {exc}")
        if stored and self.outputs is not None:
            await asyncio.to_thread(self._record, job_id, stored)
        for entry in desc.staging:
            if entry.delete_on_termination:
                try:
                    base = self._base(directory, entry)
                    await asyncio.to_thread(remove_inside, base, entry.file_name, account)
                except (GBrokerError, OSError) as exc:
                    problems.append(f"DeleteOnTermination of {entry.file_name}: {exc}")
        if not problems:
            return None
        return "; ".join(problems)[:MAX_STAGING_ERROR_CHARS]

    async def _deliver(
        self,
        directory: Path,
        entry: StagingEntry,
        index: int,
        stored: dict[str, dict[str, object]],
        account: Account,
    ) -> None:
        field = f"staging[{index}].target"
        target = check_target(entry.target, allow_private=self.allow_private, field=field)
        base = self._base(directory, entry)
        try:
            descriptor = await asyncio.to_thread(open_inside, base, entry.file_name, account)
        except FileNotFoundError:
            raise InvalidInput(field, f"a file {entry.file_name} the job made", "none") from None
        if target.kind is TargetKind.STORE:
            if self.store is None:
                os.close(descriptor)
                raise InvalidInput(field, "a site with a file store", entry.target)
            if entry.creation_flag is CreationFlag.DONT_OVERWRITE and entry.file_name in stored:
                os.close(descriptor)
                raise InvalidInput(field, "one store entry per file (dontOverwrite)", "another")
            sha256, size = await asyncio.to_thread(self.store.keep, descriptor, field)
            stored[entry.file_name] = {"sha256": sha256, "size": size}
            return
        with os.fdopen(descriptor, "rb") as body:
            if entry.creation_flag is CreationFlag.DONT_OVERWRITE and await exists(
                target, allow_private=self.allow_private, field=field
            ):
                raise InvalidInput(field, "a target with no file yet (dontOverwrite)", "one")
            await deliver(
                target,
                body,
                os.fstat(body.fileno()).st_size,
                allow_private=self.allow_private,
                field=field,
            )

    def _record(self, job_id: str, stored: Mapping[str, dict[str, object]]) -> None:
        assert self.outputs is not None
        self.outputs.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.outputs / f"{job_id}.json"
        old: dict[str, object] = {}
        with contextlib.suppress(FileNotFoundError, ValueError):
            old = json.loads(path.read_text())
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps({**old, **stored}))
        partial.replace(path)

    # -- reading outputs back ------------------------------------------------------------------

    def stored(self, job_id: str, name: str) -> tuple[Path, int] | None:
        """The store file a job staged out as ``name`` here, with its size (None: none)."""
        if self.outputs is None or self.store is None:
            return None
        try:
            record = json.loads((self.outputs / f"{job_id}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        entry = record.get(name) if isinstance(record, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            return None
        try:
            path = self.store.path(entry["sha256"])
        except InvalidInput:
            return None
        return (path, path.stat().st_size) if path.is_file() else None

    def stream_name(self, desc: JobDescription, stream: str) -> str:
        """The file a job's ``stdout`` or ``stderr`` goes to, as the launcher opens it (in the
        job directory, or through its file system's link)."""
        key = "output" if stream == "stdout" else "error"
        name = getattr(desc, key) or stream
        fs = desc.filesystem_names.get(key)
        return f"{LINK_DIR}/{fs}/{name}" if fs else name

    def open_output(self, job_id: str, name: str) -> int:
        """A read descriptor of a job's output file ``name`` (a :meth:`stream_name`): in its
        directory, or in the file system it names, never through a link, and as the owner of
        its directory (its account: nothing the job could not read itself). Blocking: run it
        in a thread."""
        directory = self.job_dir(job_id)
        account = owner_of(directory)
        prefix = f"{LINK_DIR}/"
        if name.startswith(prefix):
            fs, _, rest = name[len(prefix) :].partition("/")
            return open_inside(self.mount(fs), rest, account)
        return open_inside(directory, name, account)
