"""SD-Policy in the daemon (issue 29), end to end through the CLI: a fleet from `gbroker fleet up
--sd-policy 10`, the sample application examples/malleable_pi.py submitted with `gbroker
submit` as users do, its processes' CPUs read in /proc (and their cgroup's cpuset when the site
confines jobs in cgroups, as a root broker does).

One site of 2 cores. A malleable mate (1 to 2 cores, 600 s asked) runs on both; the site
publishes the core it would lend (``shareable``), which F(j) counts for a malleable job but not
for a rigid one (`gbroker explain`). A malleable guest (1 to 2 cores, 60 s asked) comes: waiting
for the mate would end it after the mate's planned end, sharing ends it sooner, so SD-Policy
starts it at once on the core the mate gives up. The mate hears the offer, moves to one CPU,
and the guest runs on the other; when the guest ends, the mate grows back onto both. Both end
done, with every batch counted once.

The jobs sleep between their batches (``--pause``), so the test neither loads the host nor
times anything: what it checks is the order of what the brokers recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gbroker.security import runtime
from gbroker.security.auth import bearer
from tests import harness
from tests.conftest import ROOT
from tests.fleet.one_site import job_cpus, one_site_fleet, processes, until

T = TypeVar("T")

MATE = """\
name: mate
executable: python3
arguments: [malleable_pi.py, --batches, "250", --samples, "2000", --pause, "0.1"]
job_class: malleable
min_cores: 1
max_cores: 2
wall_time_limit: 600
malleability: {deadline: 10}
"""
GUEST = MATE.replace("name: mate", "name: guest").replace('"250"', '"30"')
GUEST = GUEST.replace("wall_time_limit: 600", "wall_time_limit: 60")
RIGID = "executable: /bin/true\ntotal_cpu_count: {exact: 1}\nwall_time_limit: 60\n"


def gbroker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The harness's; it must succeed unless told otherwise."""
    return harness.gbroker(*args, check=check)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A 1-site fleet of 2 cores running SD-Policy; its directory and URL."""
    yield from one_site_fleet(tmp_path, "gbroker-sdpolicy-", "--sd-policy", "10")


def cpu_list(text: str) -> frozenset[int]:
    """A kernel CPU list ("0-1,3") as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def job_cpusets(job_id: str) -> set[frozenset[int]]:
    """The ``cpuset.cpus`` of the cgroups the job's processes are in (v1 or v2); empty when the
    site does not confine its jobs in cgroups (a broker that is not root)."""
    mounts = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, options, *_ = line.split()
        if kind == "cgroup2":
            mounts["v2"] = where
        elif kind == "cgroup" and "cpuset" in options.split(","):
            mounts["v1"] = where
    found: set[frozenset[int]] = set()
    for pid in processes(job_id):
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if not path.startswith("/gbroker/"):
                continue  # not a job's own cgroup
            if "cpuset" in controllers.split(",") and "v1" in mounts:
                cpus = Path(mounts["v1"] + path, "cpuset.cpus")
            elif controllers == "" and "v2" in mounts:
                cpus = Path(mounts["v2"] + path, "cpuset.cpus")
            else:
                continue
            if cpus.exists():
                found.add(cpu_list(cpus.read_text()))
    return found


def status(job_id: str, url: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(gbroker("status", job_id, "--broker", url, "--json").stdout)
    return answer


def history(job_id: str, url: str) -> list[str]:
    """The states the job's owner recorded, in order (`gbroker history --json`)."""
    answer = json.loads(gbroker("history", job_id, "--broker", url, "--json").stdout)
    return [entry["state"] for entry in answer]


def site_state(url: str) -> dict[str, Any]:
    """What DCSMon publishes of the site (its state document)."""
    request = urllib.request.Request(
        f"{url}/api/v1/state", headers=bearer(runtime.find_token(url) or "")
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        state: dict[str, Any] = json.loads(response.read())
    return state


def verdict(description: Path, url: str) -> dict[str, Any]:
    """How the owner ranks the site for a job description now (`gbroker explain --json`)."""
    answer = json.loads(gbroker("explain", str(description), "--broker", url, "--json").stdout)
    [candidate] = answer["candidates"]
    assert candidate["site"] == "solo"
    return dict(candidate)


def test_a_guest_starts_at_once_beside_a_shrunk_mate_which_grows_back_when_it_ends(
    site: tuple[Path, str], tmp_path: Path
) -> None:
    fleet, url = site
    host = sorted(os.sched_getaffinity(0))
    both = frozenset(host[:2])
    assert len(both) == 2, "this test needs a machine with 2 CPUs"
    program = str(ROOT / "examples" / "malleable_pi.py")
    (tmp_path / "mate.yaml").write_text(MATE)
    (tmp_path / "guest.yaml").write_text(GUEST)
    (tmp_path / "rigid.yaml").write_text(RIGID)

    mate = gbroker("submit", str(tmp_path / "mate.yaml"), "--broker", url, "--upload", program)
    mate_id = mate.stdout.strip()
    stdout = fleet / "solo" / "jobs" / mate_id / "stdout"

    def workers() -> list[str]:
        text = stdout.read_text() if stdout.exists() else ""
        return [f.split("=", 1)[1] for f in text.split() if f.startswith("workers=")]

    until("the mate at work on 2 workers", lambda: workers().count("2") >= 2)
    assert job_cpus(mate_id) == {both}
    # A root broker confines each job in a cgroup of its own, whose cpuset is the job's CPUs
    # (as CI runs it); a broker that is not root, by CPU affinity alone.
    confined = os.geteuid() == 0
    assert job_cpusets(mate_id) == ({both} if confined else set())

    # The site would lend one of the mate's cores (SharingFactor 0.5 of 2) to a job that may
    # share: F(j) counts it for the malleable guest (it would start now), not for a rigid job.
    state = until("the mate's core published", lambda: (s := site_state(url))["running"] and s)
    assert (state["free_cores"], state.get("shareable")) == (0, 1)
    assert verdict(tmp_path / "guest.yaml", url)["waits"] is False
    assert verdict(tmp_path / "rigid.yaml", url)["waits"] is True

    guest = gbroker("submit", str(tmp_path / "guest.yaml"), "--broker", url, "--upload", program)
    guest_id = guest.stdout.strip()
    shared = until("the guest running", lambda: (s := status(guest_id, url))["started_at"] and s)
    assert shared["cores"] == 1
    # The mate was offered one core, took it, and its processes moved there; the guest runs on
    # the other CPU.
    until("the mate on one CPU", lambda: (c := job_cpus(mate_id)) and all(len(s) == 1 for s in c))
    until("the guest's processes", lambda: job_cpus(guest_id))
    [mate_cpus] = job_cpus(mate_id)
    guest_cpus = job_cpus(guest_id)
    assert guest_cpus == {both - mate_cpus}, (mate_cpus, guest_cpus)
    if confined:
        assert job_cpusets(mate_id) == {mate_cpus}
        assert job_cpusets(guest_id) == {both - mate_cpus}
    until("one worker", lambda: "1" in workers(), timeout=30)
    assert [cores for _, cores in status(mate_id, url)["allocations"]] == [2, 1]
    assert (site_state(url)["free_cores"], site_state(url).get("shareable", 0)) == (0, 0)

    # The guest ends; the mate grows back onto both CPUs.
    guest_end = until("the guest's end", lambda: (s := status(guest_id, url))["ended_at"] and s)
    assert guest_end["state"] == "done"
    until("both CPUs again", lambda: job_cpus(mate_id) == {both}, timeout=30)
    if confined:
        assert job_cpusets(mate_id) == {both}
    until("two workers again", lambda: workers()[-1] == "2", timeout=30)
    final = until("the mate's end", lambda: (s := status(mate_id, url))["ended_at"] and s, 180)
    assert final["state"] == "done"

    # What the owner recorded: the mate shrank when the guest came, grew back after it ended,
    # and outlived it; the guest ran on one core from its start to its end, beside it.
    (start, two), (shrunk, one), (grown, again) = final["allocations"]
    assert (two, one, again) == (2, 1, 2)
    assert start < guest_end["submitted_at"] <= shrunk <= guest_end["ended_at"] <= grown
    assert grown < final["ended_at"]
    assert final["started_at"] < guest_end["started_at"] < guest_end["ended_at"]
    assert [cores for _, cores in guest_end["allocations"]] == [1]
    for job_id in (mate_id, guest_id):
        assert history(job_id, url) == ["submitted", "staging", "queued", "running", "done"]
    # Every batch counted once, across the resizes; the mate heard each size it had.
    mate_result = json.loads((fleet / "solo" / "jobs" / mate_id / "result.json").read_text())
    assert mate_result["batches"] == 250
    assert [cores for _, cores in mate_result["allocations"]][-3:] == [2, 1, 2]
    guest_result = json.loads((fleet / "solo" / "jobs" / guest_id / "result.json").read_text())
    assert guest_result["batches"] == 30
    log = (fleet / "solo.log").read_text()
    assert "solo: SD-Policy (MAX_SLOWDOWN 10, SharingFactor 0.5, m 2, ideal runtime model)" in log
    assert f"job {guest_id} started on 1 cores lent by running mates" in log


ASKING = """\
import asyncio

from gbroker.app import malleable


async def main() -> None:
    async with malleable.Channel() as channel:
        while await channel.next(timeout=30) is None:  # until the site has connected
            pass
        for _ in range(2000):  # more cores, again and again, while it shares
            await channel.request(2)
            await asyncio.sleep(0)
        await asyncio.sleep(3)
        print("cores", channel.allocation.cores, flush=True)


asyncio.run(main())
"""


ASKS = """\
name: asks
executable: python3
arguments: [asks.py]
job_class: malleable
min_cores: 1
max_cores: 2
wall_time_limit: 60
"""


def test_a_guest_that_asks_for_more_in_a_loop_keeps_its_share_and_is_logged_once(
    site: tuple[Path, str], tmp_path: Path
) -> None:
    """A job is an attacker: a guest asks for both cores 2,000 times while it shares. SD-Policy
    refuses a sharing job's own requests; the broker says so once, the guest keeps its one
    core, and the mate grows back when it ends."""
    fleet, url = site
    program = str(ROOT / "examples" / "malleable_pi.py")
    (tmp_path / "mate.yaml").write_text(MATE)
    (tmp_path / "asks.py").write_text(ASKING)
    (tmp_path / "asks.yaml").write_text(ASKS)
    mate = gbroker("submit", str(tmp_path / "mate.yaml"), "--broker", url, "--upload", program)
    mate_id = mate.stdout.strip()
    until("the mate on 2 cores", lambda: job_cpus(mate_id) and site_state(url).get("shareable"))
    asks = gbroker(
        "submit", str(tmp_path / "asks.yaml"), "--broker", url,
        "--upload", str(tmp_path / "asks.py"),
    ).stdout.strip()  # fmt: skip
    final = until("the guest's end", lambda: (s := status(asks, url))["ended_at"] and s)
    assert final["state"] == "done", gbroker("output", asks, "--broker", url, "--stream", "stderr")
    assert [cores for _, cores in final["allocations"]] == [1]
    assert gbroker("output", asks, "--broker", url).stdout == "cores 1\n"
    log = (fleet / "solo.log").read_text()
    assert log.count(f"job {asks} asked for 2 cores") == 1, log
    assert "a job not sharing its cores (SD-Policy)" in log
    until("the mate grown back", lambda: len(status(mate_id, url)["allocations"]) == 3)
    assert [cores for _, cores in status(mate_id, url)["allocations"]] == [2, 1, 2]
    gbroker("cancel", mate_id, "--broker", url)


def test_a_restarted_broker_grows_the_mate_back_though_it_lost_the_shares(
    site: tuple[Path, str], tmp_path: Path
) -> None:
    """SIGKILL the broker while the guest runs beside the shrunk mate. The restarted broker
    adopts both on the cores it journaled; the shares were in its memory only, so it grows a
    job taken back short of what it asked as soon as cores are free and nobody waits: the mate
    grows back once the guest has ended, offered as soon as it listens again."""
    fleet, url = site
    both = frozenset(sorted(os.sched_getaffinity(0))[:2])
    program = str(ROOT / "examples" / "malleable_pi.py")
    (tmp_path / "mate.yaml").write_text(MATE)
    (tmp_path / "guest.yaml").write_text(GUEST.replace('"30"', '"60"'))
    mate = gbroker("submit", str(tmp_path / "mate.yaml"), "--broker", url, "--upload", program)
    mate_id = mate.stdout.strip()
    until("the mate on 2 cores", lambda: job_cpus(mate_id) == {both})
    guest = gbroker("submit", str(tmp_path / "guest.yaml"), "--broker", url, "--upload", program)
    guest_id = guest.stdout.strip()
    until("the shrink journaled", lambda: len(status(mate_id, url)["allocations"]) == 2)

    gbroker("fleet", "kill", "solo", "--dir", str(fleet))
    gbroker("fleet", "restart", "solo", "--dir", str(fleet))
    url = json.loads((fleet / "fleet.json").read_text())["sites"]["solo"]["url"]
    ended = until("the guest's end", lambda: (s := status(guest_id, url))["ended_at"] and s)
    assert ended["state"] == "done"
    until("both CPUs again", lambda: job_cpus(mate_id) == {both}, timeout=30)
    final = until("the mate's end", lambda: (s := status(mate_id, url))["ended_at"] and s, 180)
    assert final["state"] == "done"
    assert [cores for _, cores in final["allocations"]] == [2, 1, 2]
    assert final["allocations"][2][0] >= ended["ended_at"]
    result = json.loads((fleet / "solo" / "jobs" / mate_id / "result.json").read_text())
    assert result["batches"] == 250
