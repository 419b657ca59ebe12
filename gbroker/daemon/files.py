"""Files: the broker's content-addressed store, and how its routes answer a bad request.

Theory of operation. A client uploads each input file once (``PUT /files/<sha256>``); the store
streams it to a temporary name, hashing as it goes, and keeps it under its sha256 only if the bytes
match, so a name in the store always means that content. A job names its inputs as staging entries
whose source is a store URL (``<broker>/files/<sha256>``), another http(s) URL, or inline data;
a job's output staged out to the store (:meth:`FileStore.keep`) is kept the same way.

A site stages a dispatched job's inputs before queueing it (:mod:`gbroker.daemon.staging`): it
fetches each source, and verifies the sha256 again when the source is a store URL, so staging
takes real time on real links and a corrupted transfer never reaches a job.

What a job can change (its directory, a site's shared file systems) is read and written through
:mod:`gbroker.site.safe_paths`: as the job's account, following no link.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

from aiohttp import web

from gbroker.errors import GBrokerError, InternalError, InvalidInput

__all__ = ["FileStore", "bad_request"]


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


class FileStore:
    """``root/<sha256>`` files, each at most ``max_upload`` bytes; ``routes()`` serves them."""

    def __init__(self, root: Path, max_upload: int) -> None:
        self.root = root
        self.max_upload = max_upload
        self._uploads = itertools.count(1)

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/files/{sha256}", self._put), web.get("/files/{sha256}", self._get)]

    def keep(self, descriptor: int, field: str = "file") -> tuple[str, int]:
        """Store the rest of an open file under its sha256 (blocking: run it in a thread);
        (sha256, size). The descriptor is closed.

        A file longer than ``max_upload`` is refused (:class:`InvalidInput` naming ``field``)
        before a byte is copied: its length counts, not the blocks it holds, so a sparse file
        (``truncate -s 1536M``) is as large as it reads. A file that grows past the limit while
        it is copied is refused too; nothing of a refused file stays in the store."""
        limit = self.max_upload
        digest = hashlib.sha256()
        size = 0
        partial = self.root / f".keep{next(self._uploads)}-{os.getpid()}"
        with os.fdopen(descriptor, "rb") as source:
            length = os.fstat(source.fileno()).st_size
            if length > limit:
                raise InvalidInput(field, self._at_most(), f"{length} bytes")
            self.root.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                with os.fdopen(os.open(partial, flags, 0o600), "wb") as out:
                    while chunk := source.read(1 << 16):
                        size += len(chunk)
                        if size > limit:
                            raise InvalidInput(field, self._at_most(), f"more than {limit} bytes")
                        digest.update(chunk)
                        out.write(chunk)
                path = self.root / digest.hexdigest()
                if not path.exists():
                    partial.replace(path)
            finally:
                partial.unlink(missing_ok=True)
        return digest.hexdigest(), size

    def _at_most(self) -> str:
        return f"a file of at most {self.max_upload} bytes (the file store's limit, --max-upload)"

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
