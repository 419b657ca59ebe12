"""Benchmark: how fast a fleet's brokers rejoin MQTT after the MQTT broker comes back.

    python -m scripts.bench.bench_rejoin [--mqtt amqtt --mqtt mosquitto] [--restarts 10]
                                   [--down-for 3 --down-for 12] [--topology FILE] [--json]

For each MQTT broker kind, it starts a fleet with ``gbroker fleet up`` (the user's path, its
defaults), waits until every broker has joined, then ``--restarts`` times: SIGKILLs the MQTT
broker, keeps it down for each ``--down-for`` in turn, starts it again and times, per broker,
from the moment the MQTT broker listens again to the moment the broker's ``/api/v1/health``
says its MQTT link is up. It prints p50, p99 and the maximum over all brokers and restarts, per
kind and outage length. A rejoin that takes longer than ``--give-up`` seconds counts as that.
Each fleet is brought down however the run ends (Ctrl-C, SIGTERM and SIGHUP included:
scripts/orderly.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gbroker import fleet
from gbroker.security.auth import bearer
from scripts import ROOT, options, orderly


async def _joined(session: aiohttp.ClientSession, url: str, token: str | None) -> bool:
    try:
        async with session.get(f"{url}/api/v1/health", headers=bearer(token or "")) as response:
            report: dict[str, Any] = await response.json()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return False
    return bool(report.get("mqtt", {}).get("ok"))


async def _until(
    session: aiohttp.ClientSession, url: str, token: str | None, joined: bool, give_up: float
) -> float:
    """Seconds until the broker at ``url`` says its MQTT link is (``joined``) up or down."""
    began = time.monotonic()
    while time.monotonic() - began < give_up:
        if await _joined(session, url, token) == joined:
            return time.monotonic() - began
        await asyncio.sleep(0.05)
    return give_up


async def one_kind(
    kind: str, topology: Path, restarts: int, outages: list[float], give_up: float
) -> dict[float, list[float]]:
    times: dict[float, list[float]] = {down: [] for down in outages}
    with (
        orderly.temporary_directory("bench-rejoin-") as tmp,
        orderly.fleet(topology, tmp / "fleet", mqtt=kind) as record,
    ):
        directory = tmp / "fleet"
        token = fleet.client_token(directory)
        urls = [member["url"] for member in record["sites"].values()]
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            joins = [_until(session, u, token, True, 60.0) for u in urls]
            await asyncio.gather(*joins)
            for n in range(restarts):
                for down in outages:
                    fleet.kill_mqtt(directory)
                    left = [_until(session, u, token, False, 30.0) for u in urls]
                    await asyncio.gather(*left)  # every broker noticed the loss
                    await asyncio.sleep(down)
                    with orderly.held():  # not stopped while its new process is unrecorded
                        await asyncio.to_thread(fleet.restart_mqtt, directory)
                    orderly.deliver()
                    joins = [_until(session, u, token, True, give_up) for u in urls]
                    took = await asyncio.gather(*joins)
                    times[down].extend(took)
                    print(
                        f"{kind:9} restart {n + 1:2}/{restarts}, down {down:4.1f} s: "
                        f"rejoined in {min(took):5.2f}-{max(took):5.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return times


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mqtt", action="append", choices=fleet.MQTT_BROKERS)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--down-for", type=float, action="append", dest="outages")
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "paper-6.yaml")
    parser.add_argument("--give-up", type=float, default=60.0)
    options.add_json(parser)
    args = parser.parse_args()
    kinds = args.mqtt or list(fleet.MQTT_BROKERS)
    outages = args.outages or [3.0, 12.0]
    results = []
    for kind in kinds:
        times = asyncio.run(one_kind(kind, args.topology, args.restarts, outages, args.give_up))
        for down, took in times.items():
            results.append(
                {
                    "mqtt": kind,
                    "down_for_s": down,
                    "rejoins": len(took),
                    "p50_s": statistics.median(took),
                    "p99_s": _percentile(took, 99),
                    "max_s": max(took),
                }
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'MQTT broker':12} {'down':>6} {'rejoins':>8} {'p50':>7} {'p99':>7} {'max':>7}")
    for r in results:
        print(
            f"{r['mqtt']:12} {r['down_for_s']:5.1f}s {r['rejoins']:8} "
            f"{r['p50_s']:6.2f}s {r['p99_s']:6.2f}s {r['max_s']:6.2f}s"
        )


if __name__ == "__main__":
    orderly.run(main)
