"""Where a user's fleet is, so that no client command needs a URL, a port or a token typed.

Theory of operation. ``gbroker fleet up`` writes a fleet directory (``fleet.json``: each site's
URL; ``tokens``: the fleet's client tokens, 0600; ``tls/ca.crt`` with ``--tls``). Every command
that needs a fleet finds its directory the same way (:func:`find`):

1. ``$GBROKER_FLEET``, when set: that directory and no other (a typo is an error, never a silent
   fall-back to another fleet);
2. else the nearest ``.gbroker-fleet`` walking up from the current directory, if that fleet
   runs: a directory under a project whose fleet was brought up at its root finds it, unless a
   nearer ``.gbroker-fleet`` stands between them (a running one wins; a stopped one sends the
   search to the default);
3. else the user's default fleet: of the fleets the user brought up, wherever, the most recent
   one still running. :func:`default_pointer` lists their directories, most recent first
   (``fleet up`` adds its own at the top, ``fleet down`` takes its own out; a fleet whose
   directory no longer holds a ``fleet.json`` is skipped, and dropped at the next change), so
   that bringing down the fleet of another directory leaves the earlier one the default.
   A command that used it says so on stderr (:func:`used_note`): nothing where it ran named
   that fleet, and another fleet of the user's, brought up meanwhile, would be used as silently.

``fleet up`` without ``--dir`` puts a new fleet in ``$GBROKER_FLEET``, else in the nearest
``.gbroker-fleet`` walking up (one that held a fleet before: its data directories resume), else in
``./.gbroker-fleet`` (:func:`for_up`).

This module imports only ``os`` (``json`` when it reads ``fleet.json``): every client command
reads it at start; finding the default fleet costs one small file read and a ``stat`` per fleet
listed until one runs. :func:`brokers` reads the fleet's ``brokers`` file (``SITE URL`` lines,
written beside ``fleet.json``), which needs no JSON.
"""

from __future__ import annotations

import os

__all__ = [
    "BROKERS_FILE",
    "DIR_NAME",
    "ENV",
    "FLEET_FILE",
    "NoFleet",
    "brokers",
    "default_fleet",
    "default_pointer",
    "find",
    "find_ca",
    "for_up",
    "forget_default",
    "locate",
    "read",
    "remember_default",
    "used_note",
]

ENV = "GBROKER_FLEET"
DIR_NAME = ".gbroker-fleet"
FLEET_FILE = "fleet.json"
BROKERS_FILE = "brokers"
TLS_DIR = "tls"  # the fleet's CA and site certificates (gbroker.security.tls writes them)
CA_FILE = "ca.crt"  # the CA's certificate in TLS_DIR, which clients verify brokers against


class NoFleet(Exception):
    """No fleet was found (or the one named is not there); the message says where we looked.

    (A plain ``Exception``: importing :mod:`gbroker.errors` costs a client's start-up; callers
    that need a :class:`~gbroker.errors.GBrokerError` wrap it.)"""


REMEMBERED = 16
"""How many of the fleets the user brought up :func:`default_pointer` lists at most."""


def default_pointer() -> str:
    """The file that lists the user's fleet directories, most recent first, one a line:
    ``$XDG_STATE_HOME/gbroker/default-fleet``, else ``~/.local/state/gbroker/default-fleet``.
    (The native front, ``gbroker/cli/native/gbroker.c``, reads it too.)"""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "gbroker", "default-fleet")


def _remembered() -> list[str]:
    """The fleet directories :func:`default_pointer` lists, most recent first (some may be
    down)."""
    try:
        with open(default_pointer()) as f:
            lines = f.read().split("\n")
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip()]


def _runs(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, FLEET_FILE))


def _remember(directories: list[str]) -> None:
    """Write the list (best effort: a read-only home is fine); replaced whole, so a client
    reading it meanwhile sees the old list or the new one."""
    pointer = default_pointer()
    try:
        if not directories:
            os.unlink(pointer)
            return
        os.makedirs(os.path.dirname(pointer), mode=0o700, exist_ok=True)
        partial = f"{pointer}.{os.getpid()}"
        with open(partial, "w") as f:
            f.write("".join(d + "\n" for d in directories))
        os.replace(partial, pointer)
    except OSError:
        pass


def _walk_up(start: str) -> str | None:
    """The nearest ``.gbroker-fleet`` directory at or above ``start``."""
    here = os.path.abspath(start)
    while True:
        candidate = os.path.join(here, DIR_NAME)
        if os.path.isdir(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def default_fleet() -> str | None:
    """The user's default fleet: the most recent one listed that still runs."""
    return next((d for d in _remembered() if _runs(d)), None)


def find(start: str | None = None) -> str:
    """The directory of the fleet to use (see the module docstring); raises :class:`NoFleet`."""
    return locate(start)[0]


def locate(start: str | None = None) -> tuple[str, str]:
    """:func:`find`'s directory and how it was found: ``"named"`` (``$GBROKER_FLEET``),
    ``"near"`` (a ``.gbroker-fleet`` walking up) or ``"default"`` (the user's most recent fleet
    still running, which may be anywhere: :func:`used_note` says so)."""
    named = os.environ.get(ENV)
    if named:
        if not os.path.isfile(os.path.join(named, FLEET_FILE)):
            raise NoFleet(f"${ENV} names {named}, which holds no running fleet (no {FLEET_FILE})")
        return os.path.abspath(named), "named"
    near = _walk_up(start or os.getcwd())
    if near is not None and os.path.isfile(os.path.join(near, FLEET_FILE)):
        return near, "near"
    pointed = default_fleet()
    if pointed is not None:
        return pointed, "default"
    looked = f"{near} (no {FLEET_FILE}: it is down)" if near else f"no {DIR_NAME} above here"
    raise NoFleet(
        f"no running fleet found: ${ENV} is unset, {looked}, and no default fleet of yours "
        "runs; start one with `gbroker fleet up --topology FILE`, or name a broker with "
        "--broker URL"
    )


def used_note(directory: str) -> str:
    """What a command says (stderr) when it uses the user's default fleet: nothing here named
    it, and another fleet of theirs, brought up meanwhile, would have been used as silently.
    (The native front, ``gbroker/cli/native/gbroker.c``, says it too.)"""
    return (
        f"using the fleet in {directory}, your most recent one still running (no running "
        f"{DIR_NAME} above this directory; ${ENV} names one)"
    )


def for_up(start: str | None = None) -> str:
    """Where ``fleet up`` without ``--dir`` puts a fleet (see the module docstring)."""
    named = os.environ.get(ENV)
    if named:
        return os.path.abspath(named)
    here = start or os.getcwd()
    return _walk_up(here) or os.path.join(os.path.abspath(here), DIR_NAME)


def brokers(directory: str) -> list[tuple[str, str]] | None:
    """``(site, url)`` of each broker the fleet's ``brokers`` file lists; None without one."""
    try:
        with open(os.path.join(directory, BROKERS_FILE)) as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    pairs = [line.split(" ", 1) for line in lines if line and not line.startswith("#")]
    return [(pair[0], pair[1]) for pair in pairs if len(pair) == 2] or None


def read(directory: str) -> dict[str, object]:
    """``fleet.json`` of ``directory``; raises :class:`NoFleet` naming the file."""
    import json

    path = os.path.join(directory, FLEET_FILE)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        raise NoFleet(f"no fleet in {directory} (no {FLEET_FILE}): it is down") from None
    except (OSError, ValueError) as exc:
        raise NoFleet(f"{path}: cannot read the fleet's record ({exc})") from None
    if not isinstance(record, dict):
        raise NoFleet(f"{path}: not a fleet record")
    return record


def remember_default(directory: str) -> None:
    """Make ``directory`` the user's default fleet: first in the list of their fleets (those
    no longer running are dropped)."""
    new = os.path.abspath(directory)
    earlier = [d for d in _remembered() if d != new and _runs(d)]
    _remember([new, *earlier][:REMEMBERED])


def forget_default(directory: str) -> None:
    """Take ``directory`` out of the user's fleets (``fleet down``): the default falls back to
    the most recent one still running."""
    gone = os.path.abspath(directory)
    listed = _remembered()
    if gone in listed:
        _remember([d for d in listed if d != gone and _runs(d)])


def find_ca(
    explicit: str | os.PathLike[str] | None = None, fleet_dir: str | os.PathLike[str] | None = None
) -> str | None:
    """The CA a client verifies https brokers against: ``explicit`` (``--ca``), else
    ``$GBROKER_CA``, else ``tls/ca.crt`` of the fleet directory (``fleet_dir``, else the one
    :func:`find` finds) when there is one; None: the system's CAs."""
    chosen = explicit or os.environ.get("GBROKER_CA")
    if chosen:
        return os.fspath(chosen)
    if fleet_dir is None:
        try:
            fleet_dir = find()
        except NoFleet:
            return None
    found = os.path.join(fleet_dir, TLS_DIR, CA_FILE)
    return found if os.path.isfile(found) else None
