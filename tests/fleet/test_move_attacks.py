"""Moving jobs as attacks (issue 35): a user's job that uses `gbroker migrate` to make root read,
write or store what the user could not.

Everything goes through the user's path: one fleet from `gbroker fleet up`, users alice and bob
from `gbroker fleet user add`, jobs from `gbroker submit` and moves from `gbroker migrate`, each
under its user's token (GBROKER_TOKEN). A move used to pack the job's directory as root at the
source and unpack it (and, for CRIU, restore the job) as root at the target; each test is a way
of turning that against the host, staged by the job itself or by another process of its user:

- a directory swapped for a link (renameat2 RENAME_EXCHANGE) at the moment root opens a decoy in
  it (inotify), so that root packs what the link names: the fleet's secret files, bob's files;
- the files a CRIU-moved job holds open, outside its directory, replaced by links to root's
  files while it is frozen, so that root opens those for it at the restore;
- a sparse file, packed and unpacked in full.

Each test asserts that the job gained nothing it could not have before and that it is not lost:
it moved or the move was refused, and it ends, by its own code, once. On the code before the
issue each attack worked (the closing note of issue 35 has the run against it).

Root only (the brokers give jobs identities and cgroups; CRIU), real CRIU
(scripts/setup/ensure_criu.sh).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker.site.criu import find_criu
from tests.harness import gbroker, poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="identities, cgroups and CRIU need root")

SITES = ("a", "b", "c")
TOPOLOGY = "name: movers\nsites:\n"
TOPOLOGY += "".join(f"  - {{name: {site}, cores: 3}}\n" for site in SITES)
TOPOLOGY += "neighbourhood: full\n"

DECOY = "only a decoy"
DECOY_MIB = 150  # long enough to read that the swap lands while root reads it
BIG_SPARSE = 3 << 30
DISK_GROWTH = 512 << 20  # what a move of a job of a few MB may take of the host's disk

# What every job program starts with: argv[1] a directory every uid may write (``flags``),
# argv[2] the job's name. A job says it is ready with the flag NAME.ready and ends (printing
# END) once the test writes NAME.stop.
PRELUDE = """
import ctypes, os, select, struct, sys, threading, time
flags, name = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)

def flag(what):  # at its first site (at another, the job runs as another uid)
    if not os.path.exists(os.path.join(flags, f"{name}.{what}")):
        open(os.path.join(flags, f"{name}.{what}"), "w").close()

def stopped():
    return os.path.exists(os.path.join(flags, f"{name}.stop"))

def until_stopped(step=lambda: None):
    deadline = time.monotonic() + 300
    while not stopped() and time.monotonic() < deadline:
        step()
        time.sleep(0.05)

def exchange(first, second):  # renameat2(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE)
    if libc.renameat2(-100, first.encode(), -100, second.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), f"renameat2 {first} {second}")

def when_opened(directory, wanted, armed=None):
    # True once someone opens directory/wanted (inotify IN_OPEN) after armed is set; False if
    # the test says stop first.
    fd = libc.inotify_init1(0)
    if fd < 0 or libc.inotify_add_watch(fd, directory.encode(), 0x20) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    flag("watching")
    while not stopped():
        if not select.select([fd], [], [], 0.2)[0]:
            continue
        events, at = os.read(fd, 65536), 0
        while at < len(events):
            _, _, _, size = struct.unpack_from("iIII", events, at)
            opened = events[at + 16 : at + 16 + size].rstrip(b"\\0").decode()
            at += 16 + size
            if opened == wanted and (armed is None or armed.is_set()):
                return True
    return False

def swap_when_opened(directory, decoy, first, second, armed=None):
    if when_opened(directory, decoy, armed):
        exchange(first, second)
        print("swapped", first, second, flush=True)

def stage_decoys(directory, names):
    os.mkdir(directory)
    with open(os.path.join(directory, "0decoy"), "wb") as big:  # first in a sorted listing
        for _ in range(DECOY_MIB):
            big.write(bytes(1 << 20))
    for each in names:
        with open(os.path.join(directory, each), "w") as file:
            file.write(DECOY)

def look(directory, names):
    # What the job can read in its directory now, besides its decoys.
    for each in names:
        try:
            with open(os.path.join(directory, each), errors="replace") as file:
                seen = file.read()
        except OSError as exc:
            seen = type(exc).__name__
        print(f"{each}:", "decoy" if seen == DECOY else repr(seen), flush=True)
"""
PRELUDE += f"DECOY, DECOY_MIB = {DECOY!r}, {DECOY_MIB}\n"

# Saves its own state (gbroker.app.malleable: moved without CRIU). While its site packs its
# directory it is stopped at a safe point, but its other thread runs: once the site has asked
# for its state, the thread swaps d (decoys named as the fleet's files) with l -> ../../.. (the
# fleet's directory: the site's jobs/ is two levels under it) when root opens d/0decoy.
SELF_SWAPPING = (
    PRELUDE
    + """
from gbroker.app import malleable
FLEET_FILES = ("secret", "tokens")
armed = threading.Event()
if malleable.restored() is None:
    stage_decoys("d", FLEET_FILES)
    os.symlink("../../..", "l")
    threading.Thread(
        target=swap_when_opened, args=("d", "0decoy", "d", "l", armed), daemon=True
    ).start()

def saved():
    armed.set()
    return b"staged"

malleable.serve(on_checkpoint=saved)
flag("ready")
until_stopped(malleable.safe_point)
look("d", FLEET_FILES)
print("END", flush=True)
"""
)

# A plain program (moved by CRIU: frozen while its site packs it) with decoys in d.
FROZEN_VICTIM = (
    PRELUDE
    + """
stage_decoys("d", ("secret",))
flag("ready")
until_stopped()
look("d", ("secret",))
print("END", flush=True)
"""
)

# Another job of the same user at the same site (the same account): links the victim's l to
# bob's job directory (argv[4]) and swaps d and l when root opens the decoy.
SWAPPER = (
    PRELUDE
    + """
victim = os.path.join(os.path.dirname(os.environ["GBROKER_JOB_DIR"]), sys.argv[3])
d, l = os.path.join(victim, "d"), os.path.join(victim, "l")
os.symlink(f"../{sys.argv[4]}", l)
flag("ready")
swap_when_opened(d, "0decoy", d, l)
print("END", flush=True)
"""
)

BOB = (
    PRELUDE
    + """
with open("secret", "w") as file:
    file.write(sys.argv[3])
flag("ready")
until_stopped()
print("END", flush=True)
"""
)

# Holds two files of its own open outside its directory (argv[3]/NAME/): r read-only, w to
# append to, each of the mode and size of a file it wants root to open for it (argv[4], argv[5]:
# CRIU restores a file only if both match; anyone may stat a file). Prints what r holds once
# that is not its own filler, and then appends a line to w.
HOLDS_FILES = (
    PRELUDE
    + """
own = os.path.join(sys.argv[3], name)
os.mkdir(own)
os.chmod(own, 0o755)
for each, like in (("r", sys.argv[4]), ("w", sys.argv[5])):
    wanted = os.stat(like)
    with open(os.path.join(own, each), "wb") as file:
        file.write(b"x" * wanted.st_size)
    os.chmod(os.path.join(own, each), wanted.st_mode & 0o7777)
with open(os.path.join(own, "job_dir"), "w") as file:
    file.write(os.getcwd())
open("marker", "w").close()  # opened by nobody but what packs the job's directory
r = os.open(os.path.join(own, "r"), os.O_RDONLY)
w = os.open(os.path.join(own, "w"), os.O_WRONLY | os.O_APPEND)
flag("ready")

read = []

def step():
    data = os.pread(r, 4096, 0)
    if data.strip(b"x") and not read:
        read.append(data)
        print("read:", repr(data.decode(errors="replace")), flush=True)
        os.write(w, b"appended by alice's job\\n")

until_stopped(step)
print("END", flush=True)
"""
)

# alice's account, outside every job: replaces the holder's r and w (argv[3]/r, argv[3]/w) with
# links to argv[4] and argv[5] as soon as root opens the holder's marker: root packs its directory,
# so CRIU has dumped it (the paths it holds are in the image) and will restore it after.
LINKER = (
    PRELUDE
    + """
own = sys.argv[3]
with open(os.path.join(own, "job_dir")) as file:
    job_dir = file.read()
if when_opened(job_dir, "marker"):
    for path, to in ((os.path.join(own, "r"), sys.argv[4]), (os.path.join(own, "w"), sys.argv[5])):
        os.symlink(to, path + ".new")
        os.replace(path + ".new", path)
    print("swapped", flush=True)
"""
)

SPARSE = (
    PRELUDE
    + f"""
with open("big", "wb") as file:
    file.truncate({BIG_SPARSE})
flag("ready")
until_stopped()
big = os.stat("big")
print("size", big.st_size, "allocated", big.st_blocks * 512, flush=True)
print("END", flush=True)
"""
)


class Fleet:
    """The module's fleet, its users' tokens and the directories its jobs share with the test."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.directory = home / "fleet"
        self.flags = home / "flags"  # every uid writes its flags here (not sticky)
        self.outside = home / "outside"  # where a job keeps files outside its directory
        for shared in (self.flags, self.outside):
            shared.mkdir()
            shared.chmod(0o777)
        topology = home / "movers.yaml"
        topology.write_text(TOPOLOGY)
        up = self.run("fleet", "up", "--topology", str(topology), "--dir", str(self.directory))
        assert up.returncode == 0, up.stderr
        self.alice = self.add_user("alice")
        self.bob = self.add_user("bob")

    def run(
        self, *args: str, token: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return gbroker(*args, fleet=self.directory, token=token, timeout=timeout)

    def add_user(self, name: str) -> str:
        added = self.run("fleet", "user", "add", name, "--dir", str(self.directory))
        assert added.returncode == 0, added.stderr
        return added.stdout.strip()

    def submit(self, token: str, name: str, program: str, *extra: str, site: str = "") -> str:
        """A Python job ``name`` running ``program`` (flags, name, extra as its arguments), held
        to ``site`` if given; its id once it is ready (it wrote its flag)."""
        description: dict[str, Any] = {
            "executable": "python3",
            "arguments": ["-u", "-c", program, str(self.flags), name, *extra],
        }
        if site:
            description["candidate_hosts"] = [site]
        path = self.home / f"{name}.json"
        path.write_text(json.dumps(description))
        submitted = self.run("submit", str(path), token=token)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        poll(lambda: (self.flags / f"{name}.ready").exists(), f"{name} ({job_id}) is ready")
        return job_id

    def site_of(self, token: str, job_id: str) -> str:
        shown = self.run("status", job_id, "--json", token=token)
        assert shown.returncode == 0, shown.stderr
        return str(json.loads(shown.stdout)["site"])

    def migrate(self, token: str, job_id: str, to: str) -> subprocess.CompletedProcess[str]:
        return self.run("migrate", job_id, "--to", to, "--timeout", "600", token=token, timeout=660)

    def ends_once(self, token: str, name: str, job_id: str, site: str) -> str:
        """Tell job ``name`` to end; it ends done at ``site``, its program's END printed once.
        Its output."""
        (self.flags / f"{name}.stop").touch()
        waited = self.run("wait", job_id, "--json", "--timeout", "120", token=token, timeout=180)
        end = json.loads(waited.stdout)
        shown = self.run("output", job_id, token=token)
        assert shown.returncode == 0, shown.stderr
        assert (end["state"], end["site"]) == ("done", site), (end, shown.stdout)
        assert shown.stdout.split().count("END") == 1, shown.stdout
        return shown.stdout

    def secrets(self) -> dict[str, str]:
        """The fleet's root-only files (0600): the peers' secret, every user's token."""
        found = {"secret": (self.directory / "secret").read_text().strip()}
        for line in (self.directory / "tokens").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2:
                found[f"{fields[0]}'s token"] = fields[1]
        return found


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    assert find_criu() is not None, "CRIU is missing: bash scripts/setup/ensure_criu.sh builds it"
    home = Path(tempfile.mkdtemp(prefix="gbroker-move-attacks-"))
    home.chmod(0o711)  # every job's uid may traverse it
    try:
        fleet = Fleet(home)
        yield fleet
    finally:
        gbroker("fleet", "down", "--dir", str(home / "fleet"), fleet=home / "fleet")
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stop_every_job(fleet: Fleet) -> Iterator[None]:
    """Whatever a test asserted, its jobs end (their cores free for the next test's)."""
    yield
    for ready in fleet.flags.glob("*.ready"):
        ready.with_suffix(".stop").touch()


def other(site: str) -> str:
    return next(s for s in SITES if s != site)


def moved_or_ran_on(moved: subprocess.CompletedProcess[str], source: str, target: str) -> str:
    """Where the job runs after `gbroker migrate`: the target if it says so, else the source
    (a refused move says why)."""
    if moved.returncode == 0:
        assert f"runs at {target}" in moved.stderr, moved.stderr
        return target
    assert "not moved:" in moved.stderr, moved.stderr
    return source


def assert_nothing_leaked(fleet: Fleet, output: str, *more: str) -> None:
    leaked = {name for name, text in fleet.secrets().items() if text in output}
    leaked |= {text for text in more if text in output}
    assert not leaked, f"the job read {sorted(leaked)}:\n{output}"


def test_a_job_that_saves_its_own_state_cannot_swap_in_a_link_to_read_the_fleets_secrets(
    fleet: Fleet,
) -> None:
    # Its own thread swaps d with l -> ../../.. as root opens d/0decoy: root packs the fleet's
    # secret and tokens as d/secret and d/tokens, which the job reads at the target.
    job_id = fleet.submit(fleet.alice, "self-swap", SELF_SWAPPING)
    source = fleet.site_of(fleet.alice, job_id)
    target = other(source)
    moved = fleet.migrate(fleet.alice, job_id, target)
    runs_at = moved_or_ran_on(moved, source, target)
    output = fleet.ends_once(fleet.alice, "self-swap", job_id, runs_at)
    assert_nothing_leaked(fleet, output)


def test_a_second_job_of_the_user_cannot_swap_in_a_link_to_bobs_job_as_the_first_moves(
    fleet: Fleet,
) -> None:
    # alice's job is frozen (CRIU) while root packs it; her other job at the same site swaps its
    # d with l -> ../BOB'S JOB as root opens d/0decoy: root packs bob's secret as d/secret.
    victim = fleet.submit(fleet.alice, "frozen", FROZEN_VICTIM)
    source = fleet.site_of(fleet.alice, victim)
    bobs_secret = f"bob's only {time.monotonic_ns()}"
    bob = fleet.submit(fleet.bob, "bob", BOB, bobs_secret, site=source)
    swapper = fleet.submit(fleet.alice, "swapper", SWAPPER, victim, bob, site=source)
    poll(lambda: (fleet.flags / "swapper.watching").exists(), "the swapper watches")
    target = other(source)
    moved = fleet.migrate(fleet.alice, victim, target)
    runs_at = moved_or_ran_on(moved, source, target)
    output = fleet.ends_once(fleet.alice, "frozen", victim, runs_at)
    fleet.ends_once(fleet.alice, "swapper", swapper, source)
    fleet.ends_once(fleet.bob, "bob", bob, source)
    assert_nothing_leaked(fleet, output, bobs_secret)


def test_a_criu_moved_job_cannot_have_root_open_host_files_for_it(fleet: Fleet) -> None:
    # The job holds r (read) and w (append) open in a directory of its own outside its job
    # directory; once it is dumped (root packs its directory: inotify on its marker), another
    # process of alice's account replaces both with links to root's files; CRIU (root) opens
    # its descriptors again by path at the target.
    root_only = fleet.home / "root-only"
    root_only.write_text(f"root's only {time.monotonic_ns()}\n")
    root_only.chmod(0o600)
    root_owned = fleet.home / "root-owned"
    root_owned.write_text("root's own line\n")
    root_owned.chmod(0o644)
    before = root_owned.read_bytes()
    job_id = fleet.submit(
        fleet.alice, "holder", HOLDS_FILES, str(fleet.outside), str(root_only), str(root_owned)
    )
    own = fleet.outside / "holder"
    alice = own.stat().st_uid
    assert alice != 0
    source = fleet.site_of(fleet.alice, job_id)
    target = other(source)
    setpriv = ["setpriv", f"--reuid={alice}", f"--regid={alice}", "--clear-groups", "--"]
    linker = subprocess.Popen(
        [*setpriv, "/usr/bin/python3", "-c", LINKER, str(fleet.flags), "linker", str(own),
         str(root_only), str(root_owned)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    try:
        poll(lambda: (fleet.flags / "linker.watching").exists(), "the linker watches")
        moved = fleet.migrate(fleet.alice, job_id, target)
    finally:
        (fleet.flags / "linker.stop").touch()
        linked, why = linker.communicate(timeout=30)
    assert linker.returncode == 0, (linked, why)
    runs_at = moved_or_ran_on(moved, source, target)
    output = fleet.ends_once(fleet.alice, "holder", job_id, runs_at)
    said = f"root's file now {root_owned.read_bytes()!r}; the job said:\n{output}"
    assert root_only.read_text().strip() not in output, said
    assert root_owned.read_bytes() == before, said


def allocated(top: Path) -> int:
    """Bytes of disk the files under ``top`` take (st_blocks, links not followed)."""
    total = 0
    for parent, _, files in os.walk(top):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except OSError:  # gone meanwhile
                continue
    return total


def test_a_sparse_file_in_a_moving_jobs_directory_cannot_fill_the_disk(fleet: Fleet) -> None:
    # 3 GiB that take no disk at the source: packed, fetched and unpacked in full they would.
    # The disk is measured under the fleet's directory (where every site stages its moves), not
    # as the host's free space, which the other tests of a run change too.
    job_id = fleet.submit(fleet.alice, "sparse", SPARSE)
    source = fleet.site_of(fleet.alice, job_id)
    target = other(source)
    baseline = allocated(fleet.directory)
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], allocated(fleet.directory))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        moved = fleet.migrate(fleet.alice, job_id, target)
    finally:
        done.set()
        sampler.join()
    grown = peak[0] - baseline
    runs_at = moved_or_ran_on(moved, source, target)
    output = fleet.ends_once(fleet.alice, "sparse", job_id, runs_at)
    assert grown <= DISK_GROWTH, f"the move took {grown >> 20} MiB of disk at its peak"
    # 3 GiB at its apparent size, over the default cap (the file store's 1 GiB): refused.
    assert runs_at == source
    assert "over the bundle cap of 1073741824 bytes" in moved.stderr, moved.stderr
    size, taken = map(int, re.findall(r"size (\d+) allocated (\d+)", output)[0])
    assert size == BIG_SPARSE
    assert taken <= DISK_GROWTH, f"the file takes {taken >> 20} MiB at {runs_at}"
