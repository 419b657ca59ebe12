"""The uid allocator of a site's users (gbroker.site.identity): stable, unique, never a uid the
host uses, a clear error when the range is spent."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from gbroker.errors import InvalidInput
from gbroker.fleet.files import site_uid_range
from gbroker.site.identity import (
    DEFAULT_RANGE,
    SITE_SPAN,
    LocalAccount,
    UidAllocator,
    closed_ancestor,
    local_account,
    parse_range,
    site_range,
)


def nothing_taken(uid: int) -> bool:
    return False


def test_a_user_keeps_their_uid_across_allocators_over_one_database(tmp_path: Path) -> None:
    first = UidAllocator(tmp_path / "uids.sqlite", "a")
    alice = first.uid_for("alice")
    assert alice in DEFAULT_RANGE
    assert first.uid_for("alice") == alice
    again = UidAllocator(tmp_path / "uids.sqlite", "a")  # a restarted broker
    assert again.uid_for("alice") == alice
    assert again.owns(alice)


def test_users_get_different_uids(tmp_path: Path) -> None:
    allocator = UidAllocator(tmp_path / "uids.sqlite", "a", range(5000000, 5000004), nothing_taken)
    uids = [allocator.uid_for(name) for name in ("alice", "bob", "carol", "dave")]
    assert sorted(uids) == list(range(5000000, 5000004))


def test_two_allocators_over_one_database_never_hand_out_one_uid_twice(tmp_path: Path) -> None:
    one = UidAllocator(tmp_path / "uids.sqlite", "a", range(5000000, 5000002), nothing_taken)
    two = UidAllocator(tmp_path / "uids.sqlite", "a", range(5000000, 5000002), nothing_taken)
    assert {one.uid_for("alice"), two.uid_for("bob")} == {5000000, 5000001}


def test_uids_the_host_uses_are_skipped(tmp_path: Path) -> None:
    taken = {5000000, 5000001, 5000003}
    allocator = UidAllocator(
        tmp_path / "uids.sqlite", "a", range(5000000, 5000004), taken.__contains__
    )
    assert allocator.uid_for("alice") == 5000002


def test_accounts_of_the_user_database_and_reserved_uids_are_skipped(tmp_path: Path) -> None:
    # Root, nobody and the broker's own uid, in the range, with the real user database.
    real = {0, 65534, os.geteuid(), *(entry.pw_uid for entry in pwd.getpwall())}
    low = UidAllocator(tmp_path / "uids.sqlite", "a", range(0, 65536)[1:])
    handed = {low.uid_for(f"user{n}") for n in range(50)}
    assert not handed & real
    assert len(handed) == 50


def test_a_spent_range_is_a_clear_error(tmp_path: Path) -> None:
    allocator = UidAllocator(tmp_path / "uids.sqlite", "a", range(5000000, 5000002), nothing_taken)
    allocator.uid_for("alice")
    allocator.uid_for("bob")
    with pytest.raises(InvalidInput) as caught:
        allocator.uid_for("carol")
    assert str(caught.value).startswith("uid_range: expected a free uid for user 'carol'")
    assert "5000000-5000001" in str(caught.value)
    assert "widen --uid-range" in str(caught.value)
    assert allocator.uid_for("alice") in (5000000, 5000001)  # the others keep theirs


def test_a_uid_an_account_took_since_is_replaced(tmp_path: Path) -> None:
    taken: set[int] = set()
    path = tmp_path / "uids.sqlite"
    alice = UidAllocator(path, "a", range(5000000, 5000004), taken.__contains__).uid_for("alice")
    taken.add(alice)  # an account of the host got that uid meanwhile
    moved = UidAllocator(path, "a", range(5000000, 5000004), taken.__contains__).uid_for("alice")
    assert moved != alice
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT uid FROM allocations WHERE name = 'alice'").fetchone() == (moved,)


def test_the_first_candidate_depends_on_site_and_user(tmp_path: Path) -> None:
    # A site that lost its database gives most users their old uid back: the hash, not the
    # order of arrival, picks the first candidate.
    one = UidAllocator(tmp_path / "1.sqlite", "a", taken=nothing_taken)
    two = UidAllocator(tmp_path / "2.sqlite", "a", taken=nothing_taken)
    two.uid_for("bob")
    assert one.uid_for("alice") == two.uid_for("alice")
    other_site = UidAllocator(tmp_path / "3.sqlite", "b", taken=nothing_taken)
    assert other_site.uid_for("alice") != one.uid_for("alice")


def test_ranges_read_and_refused() -> None:
    assert parse_range("1879048192-1879113727") == DEFAULT_RANGE
    for bad in ("0-10", "10-5", "5", "a-b", "1-4294967295", "-5"):
        with pytest.raises(InvalidInput, match="--uid-range: expected FIRST-LAST"):
            parse_range(bad)


def test_a_fleet_gives_each_site_a_slice_of_its_own() -> None:
    for index in range(4):
        assert parse_range(site_uid_range(index)) == site_range(index)
        assert len(site_range(index)) == SITE_SPAN
    assert not set(site_range(0)) & set(site_range(1))
    assert site_range(0) == DEFAULT_RANGE


def test_two_owners_never_share_a_uid_even_for_the_same_user_and_site(tmp_path: Path) -> None:
    # Two fleets on one host, each with a site "east" and a user "bob": each site kept its own
    # database, both fleets have the same default ranges, so bob of one fleet and bob of the
    # other got the same uid, and each could read the other's /proc/PID/environ and files.
    path = tmp_path / "uids.sqlite"
    one = UidAllocator(path, "east", taken=nothing_taken, owner="/srv/fleet-1/east")
    two = UidAllocator(path, "east", taken=nothing_taken, owner="/srv/fleet-2/east")
    bob_one, bob_two = one.uid_for("bob"), two.uid_for("bob")
    assert bob_one != bob_two
    assert one.owns(bob_one)
    assert not one.owns(bob_two)
    assert two.owns(bob_two)
    assert not two.owns(bob_one)
    restarted = UidAllocator(path, "east", taken=nothing_taken, owner="/srv/fleet-1/east")
    assert restarted.owns(bob_one)  # before it was asked for bob
    assert restarted.uid_for("bob") == bob_one


def test_an_older_sites_own_database_is_taken_over(tmp_path: Path) -> None:
    old = tmp_path / "data" / "uids.sqlite"
    old.parent.mkdir()
    with sqlite3.connect(old) as db:  # the schema of the release before the host database
        db.execute(
            "CREATE TABLE users (name TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE, "
            "since REAL NOT NULL)"
        )
        db.execute("INSERT INTO users VALUES ('alice', 5000003, 0)")
        db.execute("INSERT INTO users VALUES ('bob', 5000001, 0)")
    host = tmp_path / "host" / "uids.sqlite"
    # Another owner took bob's old uid meanwhile (the host database did not know of it).
    other = UidAllocator(host, "a", range(5000001, 5000002), nothing_taken, owner="other")
    assert other.uid_for("carol") == 5000001
    uids = range(5000000, 5000004)
    mine = UidAllocator(host, "a", uids, nothing_taken, owner="mine", legacy=old)
    assert mine.uid_for("alice") == 5000003  # kept
    assert mine.uid_for("bob") not in (5000001, 5000003)  # carol's now: bob gets another
    assert not mine.owns(5000001)
    assert host.stat().st_mode & 0o777 == 0o600
    assert host.parent.stat().st_mode & 0o777 == 0o700


# The search rights of a site's accounts: one policy, the kernel's (issue 36).


def test_an_account_may_search_a_directory_by_its_owners_its_groups_or_others_bit() -> None:
    base = Path(tempfile.mkdtemp(prefix="gbroker-search-"))  # under /tmp: anyone may search it
    shut = base / "shut"
    inside = shut / "jobs"
    try:
        base.chmod(0o755)
        inside.mkdir(parents=True)
        if os.geteuid() == 0:  # root searches anything: the directory is someone else's
            os.chown(shut, 54321, 54321)
        uid, gid = os.stat(shut).st_uid, os.stat(shut).st_gid
        owner = LocalAccount("owner", uid, gid + 1)
        member = LocalAccount("member", uid + 1, gid)
        other = LocalAccount("other", uid + 1, gid + 1)
        shut.chmod(0o610)  # the group may search it; the owner and others may not
        assert closed_ancestor(inside / "x", owner) == shut  # no u+x: the owner is shut out
        assert closed_ancestor(inside / "x", member) is None  # g+x: a member passes
        assert closed_ancestor(inside / "x", other) == shut
        shut.chmod(0o701)
        assert closed_ancestor(inside / "x", owner) is None
        assert closed_ancestor(inside / "x", member) == shut  # no g+x, though others may
        assert closed_ancestor(inside / "x", other) is None
        assert closed_ancestor(inside / "x", LocalAccount("root", 0, 0)) is None
    finally:
        with contextlib.suppress(OSError):
            shut.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_every_back_end_holds_its_accounts_to_the_one_policy() -> None:
    from gbroker.site import executor, identity, slurm

    for back_end in (executor, slurm):  # neither keeps a search rule of its own
        assert vars(back_end)["closed_ancestor"] is identity.closed_ancestor
    assert local_account("run_as", pwd.getpwuid(0).pw_name).uid == 0
    with pytest.raises(InvalidInput, match="run_as"):
        local_account("run_as", "no-such-account-here")
