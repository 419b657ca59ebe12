"""Files: the broker's content-addressed store, and staging a job's inputs into its directory.

Theory of operation. A client uploads each input file once (``PUT /files/<sha256>``); the store
streams it to a temporary name, hashing as it goes, and keeps it under its sha256 only if the bytes
match, so a name in the store always means that content. A job names its inputs as staging entries
whose source is a store URL (``<broker>/files/<sha256>``), another http(s) URL, or inline data.

A site that takes a dispatched job stages its inputs before queueing it (:class:`Stager`): it
fetches each source into the job's directory, and verifies the sha256 again when the source is a
store URL, so staging takes real time on real links and a corrupted transfer never reaches a job.
Downloads from a peer's store are peer traffic and carry this site's signature; a download from
anywhere else carries no credential, and reaches only public addresses (no loopback, private or
link-local host: a user cannot make a broker fetch from its neighbours), pinned after the check.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from ssl import SSLContext

from aiohttp import web

from gbroker.daemon.peers import PeerClient
from gbroker.daemon.urls import SourceKind, check_source, fetch
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from gbroker.jsdl import JobDescription

__all__ = ["FileStore", "Stager", "bad_request", "open_inside"]


def bad_request(error: GBrokerError) -> web.Response:
    """The 400 answer to a caller's mistake: the error, and for bad input its field. Our own
    failure (:class:`InternalError`, e.g. a journal commit that failed) is a 500 instead, so
    that a client retries it (with its idempotency key) rather than giving up."""
    body: dict[str, object] = {"error": str(error)}
    if isinstance(error, InvalidInput):
        body.update(field=error.field, expected=error.expected)
    elif isinstance(error, InternalError):
        return web.json_response(body, status=500)
    return web.json_response(body, status=400)


def open_inside(directory: Path, relative: str) -> int:
    """A read-only descriptor of the regular file ``relative`` inside ``directory``, opened one
    component at a time without following any symbolic link.

    A job's directory belongs to the job's user, who could plant a link there (``stdout ->
    /etc/shadow``) for a broker running as root to read and serve: nothing here follows one.
    Raises :class:`FileNotFoundError` for a missing file and :class:`InvalidInput` for anything
    but a regular file reached through real directories.
    """
    parts = [p for p in Path(relative).parts if p not in ("", ".")]
    if not parts or ".." in parts or Path(relative).is_absolute():
        raise InvalidInput("path", "a relative path inside the job directory", relative)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(directory, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags | os.O_DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
        try:
            found = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=descriptor)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidInput("path", "a regular file, not a link", relative) from None
            raise
    except NotADirectoryError:
        raise InvalidInput("path", "a path through directories, not links", relative) from None
    finally:
        os.close(descriptor)
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise InvalidInput("path", "a regular file", relative)
    return found


class FileStore:
    """``root/<sha256>`` files, each at most ``max_upload`` bytes; ``routes()`` serves them."""

    def __init__(self, root: Path, max_upload: int) -> None:
        self.root = root
        self.max_upload = max_upload
        self._uploads = itertools.count(1)

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/files/{sha256}", self._put), web.get("/files/{sha256}", self._get)]

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidInput("sha256", "64 lowercase hex digits", digest)
        return self.root / digest

    async def _put(self, request: web.Request) -> web.Response:
        """Store an upload under its sha256, streaming; refuse it unless the bytes match."""
        try:
            path = self.path(request.match_info["sha256"])
        except InvalidInput as exc:
            return bad_request(exc)
        if path.exists():
            return web.json_response({"sha256": path.name, "size": path.stat().st_size})
        limit = self.max_upload
        digest = hashlib.sha256()
        size = 0
        partial = path.with_suffix(f".part{next(self._uploads)}")
        try:
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                async for chunk in request.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        return web.json_response(
                            {"error": f"upload larger than the limit of {limit} bytes"},
                            status=413,
                        )
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != path.name:
                return web.json_response(
                    {
                        "error": f"sha256 mismatch: the body hashes to {digest.hexdigest()}",
                        "field": "sha256",
                        "expected": "the sha256 of the body",
                    },
                    status=400,
                )
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return web.json_response({"sha256": path.name, "size": size}, status=201)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        try:
            path = self.path(request.match_info["sha256"])
        except InvalidInput as exc:
            return bad_request(exc)
        if not path.is_file():
            return web.json_response({"error": f"no file {path.name}"}, status=404)
        return web.FileResponse(path)


class Stager:
    """Fetches jobs' inputs into their directories (``job_dir(job_id)``).

    Each source is checked again here (:func:`~gbroker.daemon.urls.check_source`: a peer's file
    store, or a public http(s) host unless ``allow_private``), resolved and pinned, and fetched
    with at most ``max_bytes`` accepted; a peer's file arrives with our signature, any other
    with no credential.
    """

    def __init__(
        self,
        job_dir: Callable[[str], Path],
        peers: PeerClient,
        *,
        allow_private: bool,
        max_bytes: int,
        ssl: Callable[[], SSLContext | None] = lambda: None,
    ) -> None:
        self.job_dir = job_dir
        self.peers = peers
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.ssl = ssl

    def check(self, desc: JobDescription) -> None:
        """Refuse a description whose staging sources we would never fetch (at submission)."""
        for index, entry in enumerate(desc.stage_in):
            if entry.inline_data is None:
                check_source(
                    entry.source,
                    allow_private=self.allow_private,
                    peers=self.peers.peers,
                    field=f"staging[{index}].source",
                )

    async def stage_in(self, job_id: str, desc: JobDescription) -> None:
        """Fetch a job's input files into its directory; a /files/<sha256> source is verified."""
        directory = self.job_dir(job_id)
        if desc.stage_in:  # else the launcher makes it at launch: no disk work at admission
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for index, entry in enumerate(desc.stage_in):
            target = directory / entry.file_name  # relative, inside: checked when parsed
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.inline_data is not None:
                target.write_text(entry.inline_data)
                continue
            field = f"staging[{index}].source"
            source = check_source(
                entry.source, allow_private=self.allow_private, peers=self.peers.peers, field=field
            )
            signature = None
            if source.kind is SourceKind.PEER:
                signature = self.peers.headers("GET", str(source.url))
            await fetch(
                source,
                target,
                max_bytes=self.max_bytes,
                allow_private=self.allow_private,
                peer_headers=signature,
                field=field,
                ssl=self.ssl(),
            )
