"""``gbroker demo``: a real 6-site fleet serving a stream of real jobs, end to end.

It brings up the paper's testbed as a 2D torus 2 x 3 (one broker process per site on loopback,
an embedded MQTT broker; with ``runtime="netns"`` each site in its own network namespace with
its access links shaped, :mod:`gbroker.fleet.netns`), submits a Poisson stream of jobs to random
brokers, and shows progress while the brokers dispatch them. Each job is a real process of rank
r in {2, 4, 8, 16} that runs 2-5 s and reads an input file uploaded with it; the stream is heavy
enough (about 1.2 times the fleet's 130 cores) for queues to form, so brokers send jobs to their
neighbours. At the end it prints the paper's B, T and W and where each job ran, and tears the
fleet down, also on Ctrl-C or an error. Randomness comes from ``--seed``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gbroker import fleet
from gbroker.client.gclient import Client
from gbroker.tools.progress import bar
from gbroker.topology import SiteSpec, Topology, save_topology

__all__ = ["run_demo"]

# The paper's testbed (topologies/paper-6.yaml) with a 2 x 3 torus neighbourhood.
SITES = [
    ("L4001", 16),
    ("Opteron24", 24),
    ("Xeon24", 24),
    ("P4-18", 18),
    ("Xeon80", 32),
    ("Core16", 16),
]
TORUS = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (0, 3), (1, 4), (2, 5)]


def _topology() -> Topology:
    arcs = [(SITES[a][0], SITES[b][0]) for a, b in TORUS]
    arcs += [(b, a) for a, b in arcs]
    sites = [SiteSpec(name, cores) for name, cores in SITES]
    return Topology(sites, arcs, name="paper-6-torus", data={"inputs": "Xeon80"})


def _job(seconds: float, rank: int) -> bytes:
    return (
        f"name: demo\nexecutable: /bin/sh\n"
        f'arguments: ["-c", "sleep {seconds:.2f}; wc -c < input.dat"]\n'
        f"total_cpu_count: {{exact: {rank}}}\nwall_time_limit: 60\n"
    ).encode()


async def _stream(
    urls: dict[str, str],
    jobs: int,
    rate: float,
    rng: random.Random,
    work: Path,
    token: str | None = None,
) -> list[dict[str, Any]]:
    submitted: list[tuple[str, str, float]] = []
    progress = bar(jobs, "demo: jobs ended")  # on a terminal only
    clients = {site: Client(url, token=token) for site, url in urls.items()}
    for client in clients.values():
        await client.__aenter__()
    try:
        for n in range(jobs):
            await asyncio.sleep(rng.expovariate(rate))
            entry = rng.choice(sorted(urls))
            (work / f"job{n}").mkdir()
            data = work / f"job{n}" / "input.dat"  # the name the job reads
            data.write_bytes(rng.randbytes(rng.randrange(100_000, 2_000_000)))
            job = _job(rng.uniform(2.0, 5.0), rng.choice((2, 4, 8, 16)))
            job_id = await clients[entry].submit_with_files(job, [data])
            submitted.append((job_id, entry, time.time()))
            progress.describe(f"{len(submitted)} of {jobs} submitted")
        finals: list[dict[str, Any]] = []
        pending = {job_id: entry for job_id, entry, _ in submitted}
        while pending:
            counts = Counter(final["state"] for final in finals)  # totals, every job counted
            for job_id, entry in list(pending.items()):
                status = await clients[entry].status(job_id)
                counts[status["state"]] += 1
                if status["state"] in ("done", "failed", "cancelled"):
                    finals.append({**status, "entry": entry})
                    del pending[job_id]
            progress.update(len(finals))
            order = ("done", "failed", "cancelled", "running", "queued", "staging", "submitted")
            progress.describe(", ".join(f"{counts[k]} {k}" for k in order if counts[k]))
            if pending:
                await asyncio.sleep(0.5)
        return finals
    finally:
        progress.close()
        for client in clients.values():
            await client.__aexit__(None, None, None)


def run_demo(jobs: int = 40, rate: float = 4.0, seed: int = 1, runtime: str = "local") -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="gbroker-demo-") as tmp:
        work = Path(tmp)
        topology = work / "paper-6-torus.yaml"
        save_topology(_topology(), topology)
        where = "" if runtime == "local" else f", each site in its own {runtime}"
        print(f"starting a 6-site fleet (2D torus{where}) in {work} ...", file=sys.stderr)
        record = fleet.up(topology, work / "fleet", runtime=runtime)
        try:
            urls = {name: m["url"] for name, m in record["sites"].items()}
            for name, url in urls.items():
                print(f"  {name:<10} {url}", file=sys.stderr)
            print(f"submitting {jobs} jobs (λ = {rate}/s) to random brokers", file=sys.stderr)
            token = fleet.client_token(work / "fleet")  # a container's broker is not ours
            finals = asyncio.run(_stream(urls, jobs, rate, rng, work, token))
        finally:
            for member in fleet.status(work / "fleet"):
                if not member["alive"]:  # show why a member died before its logs go
                    log = work / "fleet" / f"{member['name']}.log"
                    tail = log.read_text().splitlines()[-15:] if log.exists() else []
                    print(
                        f"{member['name']} died; its log ends:", *tail, sep="\n  ", file=sys.stderr
                    )
            fleet.down(work / "fleet")
            print("fleet down", file=sys.stderr)
    print(f"\n{'job':<28} {'entry':<10} {'ran at':<10} {'state':<7} {'wait s':>7} {'run s':>6}")
    for s in sorted(finals, key=lambda s: s["submitted_at"]):
        wait = (s["started_at"] or s["submitted_at"]) - s["submitted_at"]
        run = (s["ended_at"] or 0) - (s["started_at"] or 0) if s["started_at"] else 0.0
        print(
            f"{s['id']:<28} {s['entry']:<10} {s['site'] or '-':<10} {s['state']:<7} "
            f"{wait:>7.2f} {run:>6.2f}"
        )
    done = [s for s in finals if s["state"] == "done"]
    if done:
        first = min(s["submitted_at"] for s in done)
        span = max(s["ended_at"] for s in done) - first
        print(
            f"\nB = {len(done) / span:.3f} jobs/s   "
            f"T = {sum(s['ended_at'] - s['submitted_at'] for s in done) / len(done):.2f} s   "
            f"W = {sum(s['started_at'] - s['submitted_at'] for s in done) / len(done):.2f} s   "
            f"({len(done)} of {len(finals)} done)"
        )
    return 0 if len(done) == len(finals) else 1
