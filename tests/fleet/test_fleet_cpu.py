"""NWS for CPUs through a real fleet: a site whose core other processes spin on publishes a lower
CPU availability, and its peers see it (``/metrics``, ``/api/v1/info``).

The fleet runs on one machine, so its sites share the machine's cores. Site a is made a machine of
its own: its broker and everything it started (its CPU probe process among them) are pinned to
one core, and twenty processes spin on that core, each in a session of its own as jobs are.
Its sensor's probes then get about a twentieth of a core, while b's and c's probes run wherever
the kernel finds room: the other cores, with the rest of the machine's work (which the spinners
push there). The claim is relative and generous (a below 0.6 x the lower of b and c, as c's
broker sees them), polled until a deadline: it fails only if b's and c's probes get less than
1/12 of a core all along, i.e. a dozen other busy sessions keep every other core busy for three
minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gbroker.security.auth import Tokens
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

DEADLINE = 180.0  # a probe every 5 s, then the ensemble follows it in a few measurements
SPINNERS = 20  # pinned to one core, they take that core and no more, however many


def get(url: str, token: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body


def cpu_gauges(url: str, token: str) -> dict[str, float]:
    """``gbroker_site_cpu_availability`` by site, as the broker at ``url`` shows it."""
    text = get(f"{url}/metrics", token).decode()
    return {
        sample.labels["site"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gbroker_site_cpu_availability"
    }


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux: /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (task / "children").read_text().split()
            todo.extend(int(child) for child in children)
    return found


def pin_tree(pid: int, core: int) -> None:
    """Every thread of ``pid`` and of the processes below it on ``core`` only."""
    for process in process_tree(pid):
        for task in Path(f"/proc/{process}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), {core})
            except ProcessLookupError:  # a thread that ended meanwhile
                continue


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[dict[str, dict[str, object]], str]]:
    topology = tmp_path / "three.yaml"
    save_topology(Topology([SiteSpec(s, 1) for s in "abc"], "full", name="three"), topology)
    directory = tmp_path / "fleet"
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    token = Tokens.load(directory / "tokens").first_token()
    try:
        yield record["sites"], token
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture
def spinning() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_a_site_whose_core_is_busy_publishes_a_lower_cpu_availability_its_peers_see(
    fleet: tuple[dict[str, dict[str, object]], str], spinning: list[subprocess.Popen[bytes]]
) -> None:
    sites, token = fleet
    watcher = str(sites["c"]["url"])
    deadline = time.monotonic() + 60
    while set(cpu_gauges(watcher, token)) != {"a", "b", "c"}:  # every state carries it
        assert time.monotonic() < deadline, cpu_gauges(watcher, token)
        time.sleep(0.5)
    before = cpu_gauges(watcher, token)

    core = max(os.sched_getaffinity(0))
    pin_tree(int(str(sites["a"]["pid"])), core)
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass\n"
    spinning += [  # each in a session of its own, as jobs are (the kernel's autogroups)
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        for _ in range(SPINNERS)
    ]

    seen = []
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        gauges = cpu_gauges(watcher, token)
        seen.append(gauges)
        if gauges["a"] < 0.6 * min(gauges["b"], gauges["c"]):
            break
        time.sleep(1.0)
    assert gauges["a"] < 0.6 * min(gauges["b"], gauges["c"]), (before, seen[-10:])
    # The same figure in c's view of its neighbours (/api/v1/info), as a's state carried it.
    info = json.loads(get(f"{watcher}/api/v1/info", token))
    by_site = {row["site"]: row["state"] for row in info["neighbours"]}
    assert 0 < by_site["a"]["cpu"] <= 1
    print(f"before: {before}; after {len(seen)} polls: {gauges}")
