"""Who a user's jobs run as at a site: a uid of the user's own, from a reserved range.

Theory of operation (ARCHITECTURE §11). A client token names a user; a site maps the user to a
local account. Where the operator's map (``gbroker serve --accounts``) names one, that account
it is. Otherwise a root broker gives the user a uid of its own, as systemd's ``DynamicUser=``
does for a service: no passwd entry, no home (a job's ``HOME`` is its directory), gid the same
number (a group of its own, no group entry either). :class:`UidAllocator` picks it:

1. a user who has one keeps it (while it stays in the range and no account of the host takes
   it): the allocation is persisted, so a restarted broker gives the same user the same uid,
   and an allocation is never handed to anyone else, even after the user is removed (files
   they left keep their owner, and no new user inherits them). Every root broker of the host
   keeps its allocations in one database (:func:`host_database`, ``/var/lib/gbroker``), each
   under its *owner* (the site's data directory), so no uid is ever two owners': the users of
   two fleets on one host, even of the same name and site name, never share one (a fleet's
   sites used to keep their own databases, and the default ranges of two fleets are the same;
   a broker that finds such a database takes its allocations over);
2. a new user's first candidate is a hash of the site and the user's name into the range (as
   systemd hashes a service's name), so a site that lost its database picks the same uid again
   for most users; then the next ones, in order, wrapping around;
3. a candidate is skipped while another user of the site holds it, while the user database
   (``getpwuid``/``getgrgid``, so NSS sources such as LDAP count too) has an entry for it as a
   user or a group, and if it is one of the uids that are never anybody's (0, the broker's own,
   ``nobody``'s 65534, the 16- and 32-bit ``-1``s);
4. when every uid of the range is taken the user gets no uid, and the job an error naming the
   range (:class:`~gbroker.errors.InvalidInput` on the field ``uid_range``).

The range. :data:`DEFAULT_RANGE` is 1879048192-1879113727 (``0x70000000`` plus 65536), in the
block systemd's UIDS-GIDS.md leaves unused (1879048192-2147352575): above the system users
(0-999), the regular users (1000-60000), systemd's own dynamic users (61184-65519), ``nobody``
(65534), the subordinate ranges ``useradd`` hands out for user namespaces (from 100000, at most
600100000 by default) and systemd-nspawn's container ranges (524288-1879048191), and below
2147483648, past which some programs take a uid for a negative number. A fleet on one host gives
each of its sites a slice of its own (:func:`site_range`), so a site's first candidates are its
own; overlapping ranges (two fleets, brokers started by hand) are safe, since the host's one
database never hands a uid to two owners.

Allocations take SQLite's write lock (``BEGIN IMMEDIATE``): two brokers over one database never
hand out one uid twice. A user's uid is kept in memory once known: a start costs a dictionary
look-up, the database is touched once per user and broker.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gbroker.errors import InvalidInput

__all__ = [
    "DEFAULT_RANGE",
    "SITE_SPAN",
    "LocalAccount",
    "UidAllocator",
    "closed_ancestor",
    "host_database",
    "local_account",
    "parse_range",
    "site_range",
]

DEFAULT_RANGE = range(0x70000000, 0x70000000 + 0x10000)
"""The uids a site hands its users by default (see the module docstring for why these)."""
SITE_SPAN = 0x10000
"""The uids of each site's slice of a fleet's range (:func:`site_range`): 65536 users."""

_NEVER = frozenset({0, 65534, 65535, 0xFFFFFFFF})
"""Root, nobody, and the 16- and 32-bit ``(uid_t) -1`` (``chown`` reads the latter as "no
change")."""


def parse_range(text: str, field: str = "--uid-range") -> range:
    """``FIRST-LAST`` (inclusive) as a range of uids; 1 <= FIRST <= LAST < 2**32 - 1."""
    first, dash, last = text.partition("-")
    expected = "FIRST-LAST: uids with 1 <= FIRST <= LAST <= 4294967294 (e.g. 1879048192-1879113727)"
    if not dash or not first.isdigit() or not last.isdigit():
        raise InvalidInput(field, expected, text)
    low, high = int(first), int(last)
    if not 1 <= low <= high <= 0xFFFFFFFE:
        raise InvalidInput(field, expected, text)
    return range(low, high + 1)


def site_range(index: int, whole: range = DEFAULT_RANGE) -> range:
    """Site number ``index`` of a fleet's slice of ``whole``: :data:`SITE_SPAN` uids from
    ``whole.start + index * SITE_SPAN``."""
    start = whole.start + index * SITE_SPAN
    return range(start, start + SITE_SPAN)


def host_database() -> Path:
    """The database of every root broker's allocations on this host:
    ``$GBROKER_UID_DATABASE``, else ``/var/lib/gbroker/uids.sqlite``."""
    return Path(os.environ.get("GBROKER_UID_DATABASE", "/var/lib/gbroker/uids.sqlite"))


def _in_user_database(uid: int) -> bool:
    """Whether the user database has ``uid`` as a user or as a group."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        except OverflowError:  # beyond the C type: nobody has it
            return False
        return True
    return False


class UidAllocator:
    """A site's users' uids: stable, one per user, never one another user or account has.

    Args:
        path: the SQLite database that keeps the allocations (created when needed, 0600, its
            directory too, 0700); every owner's, so that none hands out another's uid.
        site: the site's name (the hash of a new user's first candidate covers it).
        uids: the range handed out.
        taken: whether the host already uses a uid (default: the user database has it).
        owner: whose allocations these are (default: ``site``); a broker's data directory.
        legacy: a database of this owner's allocations alone, kept by an older release (its
            users keep their uids where no other owner has taken them meanwhile).
    """

    def __init__(
        self,
        path: Path,
        site: str,
        uids: range = DEFAULT_RANGE,
        taken: Callable[[int], bool] | None = None,
        owner: str | None = None,
        legacy: Path | None = None,
    ) -> None:
        if not isinstance(uids, range) or uids.step != 1 or not uids:
            raise InvalidInput("uid_range", "a non-empty range of uids", uids)
        if uids.start < 1 or uids.stop - 1 > 0xFFFFFFFE:
            raise InvalidInput("uid_range", "uids from 1 to 4294967294", uids)
        self.path = Path(path)
        self.site = site
        self.owner = site if owner is None else owner
        self.uids = uids
        self._taken = _in_user_database if taken is None else taken
        self._known: dict[str, int] = {}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fresh = not self.path.exists()
        with contextlib.closing(self._connect()) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS allocations (owner TEXT NOT NULL, "
                "name TEXT NOT NULL, uid INTEGER NOT NULL UNIQUE, since REAL NOT NULL, "
                "PRIMARY KEY (owner, name))"
            )
            if legacy is not None and legacy.exists() and legacy != self.path:
                self._take_over(db, legacy)
        if fresh:
            os.chmod(self.path, 0o600)

    def _take_over(self, db: sqlite3.Connection, legacy: Path) -> None:
        """This owner's allocations from an older release's database of its own (a users
        table, name to uid), where the uid is still nobody else's."""
        try:
            with contextlib.closing(sqlite3.connect(f"file:{legacy}?mode=ro", uri=True)) as old:
                rows = old.execute("SELECT name, uid, since FROM users").fetchall()
        except sqlite3.Error:
            return  # not one of ours, or unreadable: nothing to take over
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT OR IGNORE INTO allocations VALUES (?, ?, ?, ?)",
            [(self.owner, name, uid, since) for name, uid, since in rows],
        )
        db.execute("COMMIT")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def __repr__(self) -> str:
        return f"uids {self.uids.start}-{self.uids.stop - 1}"

    def owns(self, uid: int) -> bool:
        """Whether ``uid`` is one this owner handed to a user (another owner's is not)."""
        if uid in self._known.values():
            return True
        with contextlib.closing(self._connect()) as db:
            row = db.execute(
                "SELECT name FROM allocations WHERE owner = ? AND uid = ?", (self.owner, uid)
            ).fetchone()
        if row is None:
            return False
        self._known[str(row[0])] = uid
        return True

    def uid_for(self, user: str) -> int:
        """``user``'s uid at this site: the one it has, else a new one (persisted first)."""
        known = self._known.get(user)
        if known is not None:
            return known
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # the write lock: one allocation at a time
            handed = {uid for (uid,) in db.execute("SELECT uid FROM allocations")}
            row = db.execute(
                "SELECT uid FROM allocations WHERE owner = ? AND name = ?", (self.owner, user)
            ).fetchone()
            if row is not None and row[0] in self.uids and not self._taken(row[0]):
                uid = int(row[0])
            else:  # new; or its uid is out of a changed range, or an account's since
                uid = self._pick(user, handed)
                db.execute(
                    "INSERT OR REPLACE INTO allocations VALUES (?, ?, ?, ?)",
                    (self.owner, user, uid, time.time()),
                )
                handed.add(uid)
            db.execute("COMMIT")
        finally:
            db.close()
        self._known[user] = uid
        return uid

    def _pick(self, user: str, handed: set[int]) -> int:
        uids = self.uids
        digest = hashlib.blake2b(f"{self.site}\0{user}".encode(), digest_size=8).digest()
        first = int.from_bytes(digest, "big") % len(uids)
        never = _NEVER | {os.geteuid()}
        for step in range(len(uids)):
            candidate = uids[(first + step) % len(uids)]
            if candidate in handed or candidate in never or self._taken(candidate):
                continue
            return candidate
        raise InvalidInput(
            "uid_range",
            f"a free uid for user {user!r} (each of {uids.start}-{uids.stop - 1} is another "
            "user's or the host's: widen --uid-range)",
            f"{len(uids)} uids taken",
        )


class LocalAccount(NamedTuple):
    """An account jobs run as at a site: its user name, uid and gid (every back-end's)."""

    name: str
    uid: int
    gid: int


def local_account(
    field_name: str, name: str, expected: str = "the name of a local account"
) -> LocalAccount:
    """The account named ``name`` in the user database; :class:`InvalidInput` on
    ``field_name`` (``expected``: what it should have named) if there is none."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise InvalidInput(field_name, expected, name) from None
    return LocalAccount(name, entry.pw_uid, entry.pw_gid)


def closed_ancestor(path: Path, account: LocalAccount) -> Path | None:
    """The first directory above ``path`` (``/`` down) that ``account`` may not search, by its
    mode bits, if any (root may search anything).

    The kernel's own rule: the owner's bit for the directory's owner, else the group's bit for
    its group, else the others' (so an owner without ``u+x`` is shut out even where others may
    pass, and a group member with ``g+x`` passes where others may not). One policy for every
    back-end: a site warns of a data directory its jobs' account cannot reach."""
    if account.uid == 0:
        return None
    for directory in reversed(path.parents):
        try:
            info = directory.stat()
        except OSError:
            return None  # not there yet: made later, by us
        if info.st_uid == account.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == account.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return directory
    return None
