"""``fleet down``: SIGTERM to every member, SIGKILL to stragglers, and the jobs of the fleet's
sites stopped (or left to a restarted broker with ``keep_jobs``); namespaces and containers
removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from gbroker.client import fleetdir
from gbroker.fleet import batch, containers, netns
from gbroker.fleet.members import (
    FLEET_FILE,
    JOBS_ROOT_FILE,
    fleet_token,
    is_alive,
    load,
    signal_group,
    signal_member,
    wait_gone,
)
from gbroker.security.auth import bearer
from gbroker.security.tls import client_context

__all__ = [
    "Down",
    "down",
]


class Down:
    """What :func:`down` did: running jobs stopped (or left) per site, processes killed per
    namespace or container (their jobs)."""

    def __init__(self) -> None:
        self.stopped: dict[str, int] = {}
        self.left: dict[str, int] = {}
        self.killed: dict[str, int] = {}
        self.unanswered: list[str] = []  # sites whose broker did not say how many jobs ran
        # Batch sites whose system was stopped, and how many jobs were cancelled in it: by
        # manager (slurm, gridengine), then site.
        self.systems: dict[str, dict[str, int]] = {}


def _running_jobs(url: str, token: str | None, context: ssl.SSLContext | None) -> int | None:
    """How many jobs the broker at ``url`` runs now (its health report), None if it does not
    answer."""
    request = urllib.request.Request(f"{url}/api/v1/health", headers=bearer(token or ""))
    try:
        with urllib.request.urlopen(request, timeout=3, context=context) as response:
            report = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503: a part fails; the report is still there
        try:
            report = json.loads(exc.read())
        except ValueError:
            return None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    running = report.get("executor", {}).get("running") if isinstance(report, dict) else None
    return running if isinstance(running, int) else None


def _job_processes(directory: Path) -> dict[str, set[int]]:
    """The process groups of jobs still running from the fleet's data directories, by site:
    each job's leader carries its directory in its environment (``GBROKER_JOB_DIR``)."""
    root = os.fsencode(str(directory.resolve())) + b"/"
    found: dict[str, set[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            group = os.getpgid(int(entry))
        except OSError:  # gone, or not ours to read
            continue
        for variable in environ:
            if variable.startswith(b"GBROKER_JOB_DIR=" + root) and group == int(entry):
                site = variable[len(b"GBROKER_JOB_DIR=") + len(root) :].split(b"/", 1)[0]
                found.setdefault(os.fsdecode(site), set()).add(group)
    return found


def down(directory: str | Path, grace: float = 10.0, keep_jobs: bool = False) -> Down:
    """Stop every member: SIGUSR1 to each broker (it stops its running jobs, then itself), or
    SIGTERM with ``keep_jobs`` (its jobs run on, for a restarted broker to adopt); SIGKILL to
    whatever is left after ``grace`` seconds. A namespace fleet's namespaces, links and bridge
    go too, and a container fleet's containers, with every process still in them. Jobs whose
    broker was not running (killed) are found by their directories, and stopped too. Each
    batch site's system (a Slurm cluster, a Grid Engine cell) is stopped last, the jobs still in
    it cancelled."""
    record = load(directory)
    done = Down()
    token = fleet_token(record)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    brokers = list(record["sites"].values())
    for member in brokers:
        if not is_alive(member["pid"]):
            continue
        running = _running_jobs(member["url"], token, context)
        if running is None:
            done.unanswered.append(member["name"])
        elif running:
            (done.left if keep_jobs else done.stopped)[member["name"]] = running
    stop = signal.SIGTERM if keep_jobs else signal.SIGUSR1
    for member in brokers:
        signal_member(member, stop)
    left = set(wait_gone([m["pid"] for m in brokers], grace))
    for member in brokers:
        if member["pid"] in left:
            signal_member(member, signal.SIGKILL)
    if record.get("mqtt"):
        member = record["mqtt"]
        signal_member(member, signal.SIGTERM)
        if wait_gone([member["pid"]], grace):
            signal_member(member, signal.SIGKILL)
    # Jobs of brokers that were not running (killed, crashed) are orphans now: stop them too.
    orphans: dict[str, set[int]] = {}
    if record.get("runtime", "local") == "local":
        for root in (
            Path(directory),
            *([Path(record["jobs_root"])] if "jobs_root" in record else []),
        ):
            for site, groups in _job_processes(root).items():
                orphans.setdefault(site, set()).update(groups)
    for site, groups in orphans.items():
        if keep_jobs:
            done.left[site] = done.left.get(site, 0) + len(groups)
            continue
        for group in groups:
            signal_group(group, signal.SIGTERM)
        if wait_gone(list(groups), grace):
            for group in groups:
                signal_group(group, signal.SIGKILL)
        done.stopped[site] = done.stopped.get(site, 0) + len(groups)
    # Each batch site's system, after its broker: the jobs still in it go with it (even with
    # keep_jobs: a cluster that outlived the fleet would be nobody's, and the next up starts
    # new ones).
    for manager, site, system in batch.systems(record):
        done.systems.setdefault(manager, {})[site] = system.stop(grace, cancel=True)
    if record.get("netns"):
        done.killed = netns.destroy(netns.NetnsFleet.from_dict(record["netns"]))
    if record.get("docker"):
        docker = record["docker"]
        done.killed = containers.remove(docker["containers"], docker["network"], docker["volumes"])
    if "jobs_root" in record and not keep_jobs:  # gbroker.fleet.launch.reachable_jobs_root
        shutil.rmtree(record["jobs_root"], ignore_errors=True)
        (Path(directory) / JOBS_ROOT_FILE).unlink(missing_ok=True)
    (Path(directory) / FLEET_FILE).unlink()
    (Path(directory) / fleetdir.BROKERS_FILE).unlink(missing_ok=True)
    fleetdir.forget_default(str(directory))
    return done
