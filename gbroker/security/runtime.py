"""Where a user's running brokers say where their token files are, so clients need no copying.

Theory of operation. A broker started by a user records ``{"url", "site", "pid", "token_file"}``
in a small JSON file in that user's runtime directory (mode 0700; the file 0600) and removes it
when it stops, as Jupyter servers do. A client of the same user, given only a broker's URL, finds
the token file there (:func:`find_token`): a user's own brokers are reachable with no token on the
command line, and nobody else can read the way in. The directory is ``$GBROKER_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/gbroker``, else ``~/.local/share/gbroker/runtime``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from gbroker.security.auth import Tokens

__all__ = ["find_token", "register", "runtime_dir"]


def runtime_dir() -> Path:
    configured = os.environ.get("GBROKER_RUNTIME_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "gbroker"
    return Path.home() / ".local" / "share" / "gbroker" / "runtime"


def _entry(url: str) -> Path:
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return runtime_dir() / f"broker-{key}.json"


def register(url: str, site: str, token_file: Path | None) -> Path | None:
    """Record a broker serving at ``url``; the entry's path (None when it could not be written:
    clients then need ``--token-file``)."""
    path = _entry(url)
    record = {
        "url": url.rstrip("/"),
        "site": site,
        "pid": os.getpid(),
        "token_file": None if token_file is None else str(token_file.resolve()),
    }
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(record, out)
        partial.replace(path)
    except OSError:
        return None
    return path


def find_token(url: str) -> str | None:
    """The first admin token (else the first token) of the broker registered at ``url``."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        record = json.loads(_entry(url).read_text())
        if record["url"] != url.rstrip("/") or not record["token_file"]:
            return None
        users = Tokens.load(Path(record["token_file"]))
        return users.first_token()
    return None
