"""The site's side of the resize protocol (gbroker.site.resize) against real processes.

A job of the executor runs (a relay, or a shell and its children, all in its process group); the
test plays the application: the job's relay listens on the job's control socket, as a malleable
application does (the site connects only to a socket of the job's own, listened on by the job:
see the last tests), and passes each connection on to the test, which listens with
gbroker.app.malleable's Channel and answers offers (or does not). What the site decides is read
from the outcome, the executor's slots and, for the CPUs, from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gbroker.app.malleable import Allocation, Channel, Offer
from gbroker.site.backend import ExitResult, JobSpec
from gbroker.site.executor import Executor
from gbroker.site.resize import Resizer

LIMIT = 20.0
CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.asyncio

# The job's side: listens on its control socket (in its directory, its working directory) and
# joins each connection of the site to the test's Channel at argv[1].
RELAY = """
import os, socket, sys, threading
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.path.basename(os.environ["GBROKER_CONTROL"]))
listener.listen()
def pipe(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for end in (source, sink):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
while True:
    site, _ = listener.accept()
    app = socket.socket(socket.AF_UNIX)
    app.connect(sys.argv[1])
    threading.Thread(target=pipe, args=(site, app), daemon=True).start()
    threading.Thread(target=pipe, args=(app, site), daemon=True).start()
"""


def group_cpus(pgid: int) -> set[frozenset[int]]:
    """The CPU sets of every thread of every live process of a group."""
    found: set[frozenset[int]] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
                continue
            for task in (proc / "task").iterdir():
                found.add(frozenset(os.sched_getaffinity(int(task.name))))
        except (OSError, ValueError):
            continue
    return found


class App:
    """The application's side, in the test: it listens on the job's control socket."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.heard: list[Offer | Allocation] = []

    async def next(self) -> Offer | Allocation:
        event = await self.channel.next(timeout=LIMIT)
        assert event is not None
        self.heard.append(event)
        return event


@pytest.fixture
def relays() -> Iterator[Path]:
    """Where the test's Channels listen: a directory the jobs (another uid) can reach."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-app-"))
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def listening(path: Path) -> AsyncIterator[Channel]:
    """The application's Channel at ``path``, which the job's relay (the job's uid) may reach."""
    async with Channel(str(path)) as channel:
        path.chmod(0o666)
        yield channel


async def started(
    executor: Executor,
    job_id: str,
    cores: int,
    asked: list[tuple[str, int]],
    app: Path | None = None,
) -> Resizer:
    """A job on ``cores`` cores, followed by a Resizer: a relay to the test's Channel at
    ``app``; without one, two processes (a shell and a sleep) that never listen."""
    ended: list[ExitResult] = []
    if app is None:
        spec = JobSpec(job_id, "sh", ("-c", "sleep 60 & wait"), control=True)
    else:
        spec = JobSpec(job_id, "/usr/bin/python3", ("-c", RELAY, str(app)), control=True)
    await executor.start(spec, cores, ended.append)
    resizer = Resizer(executor, lambda job, n: asked.append((job, n)))
    return resizer


@pytest.fixture
def two_cpus() -> None:
    if len(CPUS) < 2:
        pytest.fail("these tests need 2 CPUs (the CI machine has them)")


@pytest.mark.usefixtures("two_cpus")
async def test_a_grow_is_offered_taken_in_part_and_the_cpus_follow(
    tmp_path: Path, relays: Path
) -> None:
    asked: list[tuple[str, int]] = []
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=4) as executor:
        resizer = await started(executor, "g", 1, asked, relays / "g")
        pgid = executor.running()["g"].pid
        async with listening(relays / "g") as channel:
            app = App(channel)
            resizer.follow("g")
            assert await app.next() == Allocation(1, (CPUS[0],))  # said on connecting
            change = resizer.begin("g", 3)
            assert executor.slots_of("g") == (0, 1, 2)  # held while the job decides
            finishing = asyncio.ensure_future(resizer.finish("g", change, 5.0, False, 1))
            offer = await app.next()
            assert isinstance(offer, Offer)
            assert (offer.cores, offer.old, offer.mandatory, offer.grow) == (3, 1, False, True)
            assert offer.cpus == executor.cpus_for((0, 1, 2))
            await channel.accept(offer, 2)  # it takes 2 of the 3
            outcome = await finishing
            assert outcome is not None
            assert (outcome.cores, outcome.slots, outcome.answered) == (2, (0, 1), True)
            assert await app.next() == Allocation(2, executor.cpus_for((0, 1)))
            assert group_cpus(pgid) == {frozenset(executor.cpus_for((0, 1)))}
            await channel.request(4)  # an evolving job asks: the driver's callback hears it
            while not asked:
                await asyncio.sleep(0.01)
            assert asked == [("g", 4)]
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
@pytest.mark.parametrize(("mandatory", "cores"), [(False, 1), (True, 2)])
async def test_an_unanswered_grow_is_nothing_unless_mandatory(
    tmp_path: Path, relays: Path, mandatory: bool, cores: int
) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        resizer = await started(executor, "u", 1, [], relays / "u")
        async with listening(relays / "u") as channel:
            app = App(channel)
            resizer.follow("u")
            await app.next()
            outcome = await resizer.finish("u", resizer.begin("u", 2), 0.3, mandatory, 1)
            assert outcome is not None
            assert (outcome.cores, outcome.answered) == (cores, False)
            assert executor.slots_of("u") == (0, 1)[:cores]  # what was not taken is free
            pgid = executor.running()["u"].pid
            assert group_cpus(pgid) == {frozenset(executor.cpus_for((0, 1)[:cores]))}
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_shrink_happens_without_an_answer_and_frees_its_slot_at_once(
    tmp_path: Path,
    relays: Path,
) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        resizer = await started(executor, "s", 2, [], relays / "s")
        pgid = executor.running()["s"].pid
        assert group_cpus(pgid) == {frozenset(CPUS[:2])}
        async with listening(relays / "s") as channel:
            resizer.follow("s")
            await App(channel).next()
            change = resizer.begin("s", 1)
            # The slot it gives up is free before the job even hears of it: a job the
            # scheduler starts in the same pass takes it, not one the shrinking job keeps.
            assert executor.slots_of("s") == (0,)
            outcome = await resizer.finish("s", change, 0.3, False, 1)  # nobody answers
            assert outcome is not None
            assert (outcome.cores, outcome.answered) == (1, False)
            assert group_cpus(pgid) == {frozenset(executor.cpus_for((0,)))}
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_job_without_a_channel_is_resized_by_its_cpus_alone(tmp_path: Path) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        resizer = await started(executor, "n", 2, [])
        pgid = executor.running()["n"].pid
        resizer.follow("n")  # it never listens
        outcome = await resizer.finish("n", resizer.begin("n", 1), 5.0, False, 1)
        assert outcome is not None
        assert (outcome.cores, outcome.answered) == (1, False)  # at once: no deadline to wait
        assert group_cpus(pgid) == {frozenset(executor.cpus_for((0,)))}
        # A grow waits for a job that may not listen yet, its deadline from when the site
        # began to follow it; then it does not happen, and later grows do not wait.
        began = asyncio.get_running_loop().time()
        grown = await resizer.finish("n", resizer.begin("n", 2), 1.0, False, 1)
        waited = asyncio.get_running_loop().time() - began
        assert grown is not None
        assert (grown.cores, grown.answered) == (1, False)  # a grow nobody takes does not happen
        assert 0.5 < waited < 1.5
        began = asyncio.get_running_loop().time()
        again = await resizer.finish("n", resizer.begin("n", 2), 1.0, False, 1)
        assert again is not None
        assert again.cores == 1
        assert asyncio.get_running_loop().time() - began < 0.5  # past its deadline: at once
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_job_that_hangs_up_on_a_shrink_offer_is_shrunk_all_the_same(
    tmp_path: Path, relays: Path
) -> None:
    """A job is an attacker: offered a shrink (its core given to another job, an SD-Policy
    guest), it closes its control channel instead of answering. The shrink happens: its CPUs
    are moved, as for a job that does not answer."""
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        resizer = await started(executor, "h", 2, [], relays / "h")
        pgid = executor.running()["h"].pid
        async with listening(relays / "h") as channel:
            app = App(channel)
            resizer.follow("h")
            await app.next()
            shrinking = asyncio.ensure_future(
                resizer.finish("h", resizer.begin("h", 1), 10.0, False, 1)
            )
            assert isinstance(await app.next(), Offer)
            await channel.aclose()  # hangs up
            outcome = await shrinking
            assert outcome is not None
            assert (outcome.cores, outcome.answered) == (1, False)
            assert group_cpus(pgid) == {frozenset(executor.cpus_for((0,)))}
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_grow_offered_before_a_new_job_listens_waits_for_it(
    tmp_path: Path, relays: Path
) -> None:
    """A restarted broker adopts a job and grows it at once (SD-Policy's shares were lost with
    the restart): the offer waits until the job listens, then is taken."""
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        # The job listens only once the test's Channel does (its relay has somewhere to go).
        late = (
            "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
        )
        spec = JobSpec(
            "late", "/usr/bin/python3", ("-c", late + RELAY, str(relays / "late")), control=True
        )
        await executor.start(spec, 1, lambda result: None)
        resizer = Resizer(executor, lambda job, n: None)
        resizer.follow("late")
        growing = asyncio.ensure_future(
            resizer.finish("late", resizer.begin("late", 2), 10.0, False, 1)
        )
        await asyncio.sleep(1.0)  # the job is slow to listen
        assert not growing.done()
        async with listening(relays / "late") as channel:
            app = App(channel)
            assert isinstance(await app.next(), Allocation)
            offer = await app.next()
            assert isinstance(offer, Offer)
            assert offer.cores == 2
            await channel.accept(offer)
            outcome = await growing
            assert outcome is not None
            assert (outcome.cores, outcome.answered) == (2, True)
            pgid = executor.running()["late"].pid
            assert group_cpus(pgid) == {frozenset(executor.cpus_for((0, 1)))}
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_later_change_supersedes_one_still_waiting(tmp_path: Path, relays: Path) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=2) as executor:
        resizer = await started(executor, "w", 2, [], relays / "w")
        async with listening(relays / "w") as channel:
            app = App(channel)
            resizer.follow("w")
            await app.next()
            first = asyncio.ensure_future(resizer.finish("w", resizer.begin("w", 1), 5.0, False, 1))
            shrink = await app.next()
            assert isinstance(shrink, Offer)
            second = asyncio.ensure_future(
                resizer.finish("w", resizer.begin("w", 2), 5.0, False, 1)
            )
            grow = await app.next()
            assert isinstance(grow, Offer)
            await channel.accept(shrink, 1)
            await channel.accept(grow, 2)
            assert await first is None  # the grow decides
            outcome = await second
            assert outcome is not None
            assert outcome.cores == 2
        await resizer.aclose()


@pytest.mark.usefixtures("two_cpus")
async def test_a_shrink_the_job_answers_with_less_never_goes_below_its_minimum(
    tmp_path: Path,
    relays: Path,
) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=4) as executor:
        resizer = await started(executor, "m", 4, [], relays / "m")
        async with listening(relays / "m") as channel:
            app = App(channel)
            resizer.follow("m")
            await app.next()
            finishing = asyncio.ensure_future(
                resizer.finish("m", resizer.begin("m", 3), 5, False, 2)
            )
            offer = await app.next()
            assert isinstance(offer, Offer)
            await channel.accept(offer, 1)  # gives back more than asked, below its minimum
            outcome = await finishing
            assert outcome is not None
            assert outcome.cores == 2
        await resizer.aclose()


class Listener:
    """A root-owned socket that is not the job's (as the launcher's is): notes who connects."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_unix_server(self._connected, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


async def refused_or_connected(
    caplog: pytest.LogCaptureFixture, listener: Listener, job_id: str
) -> str:
    """Wait until the link refused the job's socket (its warning) or reached ``listener``."""
    while listener.connections == 0:
        for record in caplog.records:
            if record.getMessage().startswith(f"job {job_id}: control socket refused: "):
                return record.getMessage()
        await asyncio.sleep(0.02)
    return "connected"


async def test_a_link_in_the_jobs_directory_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The job makes its control socket a link to another socket (the launcher's, root's).
    Before: the root broker connected to it."""
    async with asyncio.timeout(LIMIT), Executor(tmp_path / "jobs", site_cores=2) as executor:
        async with Listener(tmp_path / "root.sock") as listener:
            link = f"ln -s {tmp_path / 'root.sock'} .gbroker-control && sleep 60"
            spec = JobSpec("l", "sh", ("-c", link), control=True)
            await executor.start(spec, 1, lambda result: None)
            while not executor.control_path("l").is_symlink():
                await asyncio.sleep(0.02)
            resizer = Resizer(executor, lambda job, n: None)
            with caplog.at_level(logging.WARNING, "gbroker.daemon"):
                resizer.follow("l")
                said = await refused_or_connected(caplog, listener, "l")
            await resizer.aclose()
        assert (
            said
            == f"job l: control socket refused: {executor.control_path('l')} is a symbolic link"
        )
        assert listener.connections == 0


async def test_a_socket_in_the_jobs_directory_that_is_not_the_jobs_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A socket of another uid at the job's control path (put there by someone else, or the
    job's listener handed over): refused; the job's own relay, listening, is taken."""
    async with asyncio.timeout(LIMIT), Executor(tmp_path / "jobs", site_cores=2) as executor:
        spec = JobSpec("o", "sh", ("-c", "sleep 60"), control=True)
        await executor.start(spec, 1, lambda result: None)
        async with Listener(executor.control_path("o")) as listener:
            resizer = Resizer(executor, lambda job, n: None)
            with caplog.at_level(logging.WARNING, "gbroker.daemon"):
                resizer.follow("o")
                said = await refused_or_connected(caplog, listener, "o")
            await resizer.aclose()
        uid = executor.run_as.uid
        assert said == (
            f"job o: control socket refused: {executor.control_path('o')} belongs to uid 0, "
            f"not the job's {uid}"
        )
        assert listener.connections == 0
