"""Jacobi2D for real: a co-allocated job on a fleet whose sites differ in CPU and links,
partitioned by each of AppLeS's four methods; the measured time beside the predicted one.

    python -m scripts.experiments.jacobi_real [--quick] [--n N] [--iterations K] [--repeat R]
                                  [--fleet DIR] [--topology YAML] [--json]

Issue 28, item 4b. Without ``--fleet`` it brings up a ``--runtime netns`` fleet of
``topologies/jacobi-3.yaml`` (three sites of CPU share 1, 0.5 and 0.25, access links of 100, 20
and 10 Mbit/s; as root) in a directory of its own, and takes it down at the end. Then:

1. **The model.** ``examples/jacobi2d.py`` runs once on this host, one rank of all rows, to
   measure ``compute``: CPU seconds per row per iteration (AppLeS's benchmark of the application).
   ``exchange`` is one row of float64 (8 N bytes), ``units`` the N rows.
2. **The forecasts.** Each site's CPU availability as DCSMon forecasts and publishes it (its NWS
   forecast, ``/api/v1/state``); the links as the topology gives them (tbf shapes the rate;
   the latency is the topology's).
3. **The partitions.** Compile-time blocked: equal strips at every site. Compile-time AppLeS: the
   planner on static estimates (every CPU fully available). Runtime AppLeS without selection: the
   planner on the forecasts, every site (the last set ``gbroker explain`` shows it weighed).
   Runtime AppLeS: a job with a ``model``, submitted as a user would; the owner's planner
   chooses its sites and rows.
4. **The runs.** Each partition runs as a co-allocated job (its components pinned to their
   sites, the rows in order), ``--repeat`` times, the methods interleaved. Measured: rank 0's
   overall time (start barrier to end barrier). Predicted: the planner's estimate of that
   partition on the forecasts.

It prints a table (``--json``: one document) and exits 0, or 1 if a job did not end done.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gbroker.core.apples import (
    PerformanceModel,
    Resource,
    blocked,
    communication,
    plan,
)
from gbroker.security.auth import Tokens, bearer
from gbroker.topology.files import load_topology
from scripts import ROOT

PROGRAM = ROOT / "examples" / "jacobi2d.py"
METHODS = (
    "blocked",
    "compile-time AppLeS",
    "runtime AppLeS, no selection",
    "runtime AppLeS",
)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Fleet:
    """The CLI against one fleet directory."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = {**env, "GBROKER_FLEET": str(directory)}

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gbroker", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def ok(self, *args: str, timeout: float = 600) -> str:
        done = self.run(*args, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"jacobi_real: gbroker {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.directory / "fleet.json").read_text()))

    def url(self, site: str) -> str:
        return str(self.record()["sites"][site]["url"])

    def state(self, site: str) -> dict[str, Any]:
        token = Tokens.load(self.directory / "tokens").first_token()
        request = urllib.request.Request(f"{self.url(site)}/api/v1/state", headers=bearer(token))
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.loads(response.read()))


def calibrate(n: int, iterations: int) -> float:
    """CPU seconds per row per iteration of the kernel on this host (one rank, all rows)."""
    done = subprocess.run(
        ["python3", str(PROGRAM), "--n", str(n), "--iterations", str(iterations)],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")},
    )
    if done.returncode != 0:
        raise SystemExit(f"jacobi_real: calibration failed: {done.stderr.strip()}")
    report = json.loads(done.stdout.splitlines()[-1])
    return float(report["cpu_seconds_per_row_iteration"])


def forecasts(fleet: Fleet, sites: list[str], timeout: float = 60) -> dict[str, float]:
    """Each site's published CPU forecast (waits until every site has one)."""
    deadline = time.monotonic() + timeout
    while True:
        cpu = {site: fleet.state(site).get("cpu") for site in sites}
        if all(value is not None for value in cpu.values()):
            return {site: float(value) for site, value in cpu.items()}  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            missing = ", ".join(s for s, v in cpu.items() if v is None)
            raise SystemExit(f"jacobi_real: no CPU forecast from {missing} in {timeout:g} s")
        time.sleep(1)


def run_job(
    fleet: Fleet,
    work: Path,
    name: str,
    arguments: list[str],
    description: dict[str, Any],
) -> dict[str, Any]:
    """Submit a co-allocated Jacobi2D; wait; every rank's report, rank 0's first."""
    path = work / f"{name}.json"
    job = {
        "name": name,
        "executable": "python3",
        "arguments": ["jacobi2d.py", *arguments],
        "wall_time_limit": 600,
        **description,
    }
    if "rows" in description:
        job.pop("rows")
        job["arguments"] += ["--rows", ",".join(map(str, description["rows"]))]
    path.write_text(json.dumps(job))
    job_id = fleet.ok(
        "submit", str(path), "--upload", str(PROGRAM), "--broker", fleet.url("fast")
    ).strip()
    waited = json.loads(fleet.run("wait", job_id, "--json", "--timeout", "900", timeout=960).stdout)
    if waited.get("state") != "done":
        errors = fleet.run("output", f"{job_id}_1", "--stream", "stderr").stdout
        raise SystemExit(f"jacobi_real: {name} ({job_id}) ended {waited.get('state')}: {errors}")
    ranks = []
    for element in waited["elements"]:
        out = fleet.ok("output", element["id"]).strip().splitlines()
        ranks.append(json.loads(out[-1]) | {"site": element["site"]})
        if ranks[-1].get("check", "ok") != "ok":
            raise SystemExit(f"jacobi_real: {name} ({job_id}): the grid differs from a serial run")
    ranks.sort(key=lambda r: int(r["rank"]))
    return {"id": job_id, "ranks": ranks, "overall": float(ranks[0]["overall_seconds"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid: N 240, 20 iterations")
    parser.add_argument("--n", type=int, default=1200, help="the grid is N x N (default 1200)")
    parser.add_argument("--iterations", type=int, default=100, help="default 100")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each method (default 3)")
    parser.add_argument(
        "--fleet", type=Path, help="a running fleet's directory (default: start one)"
    )
    parser.add_argument(
        "--topology", type=Path, default=ROOT / "topologies" / "jacobi-3.yaml", help="its sites"
    )
    parser.add_argument(
        "--check", action="store_true", help="each job compares its grid with a serial Jacobi"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.iterations, args.repeat = 240, 20, 1
    if args.n < 3 or args.iterations < 1 or args.repeat < 1:
        parser.error("--n >= 3, --iterations >= 1 and --repeat >= 1")
    topology = load_topology(args.topology)
    sites = list(topology.site_names)
    home = Path(tempfile.mkdtemp(prefix="gbroker-jacobi-"))
    home.chmod(0o711)  # every job's uid may traverse it
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env |= {"XDG_STATE_HOME": str(home / "state"), "GBROKER_RUNTIME_DIR": str(home / "run")}
    started = args.fleet is None
    fleet = Fleet(args.fleet or home / "fleet", env if started else dict(os.environ))
    began = time.monotonic()
    try:
        if started:
            say(f"bringing up a netns fleet of {args.topology.name} ...")
            fleet.ok("fleet", "up", "--runtime", "netns", "--topology", str(args.topology),
                     "--dir", str(fleet.directory))  # fmt: skip
        say("measuring the kernel on this host (one rank, all rows) ...")
        compute = calibrate(args.n, max(5, args.iterations // 4))
        model = PerformanceModel(
            units=args.n, compute=compute, exchange=8.0 * args.n, iterations=args.iterations
        )
        cpu = forecasts(fleet, sites)

        def link(a: str, b: str) -> tuple[float, float]:
            if a == b:
                return float("inf"), 0.0
            spec = topology.link(a, b)
            rate = min(spec.bandwidth, topology.uplink(a), topology.downlink(b))
            return rate, spec.latency

        def resources(available: dict[str, float], order: list[str]) -> list[Resource]:
            return [
                Resource(s, topology.site(s).cores, available[s], topology.site(s).speed)
                for s in order
            ]

        runtime = resources(cpu, sites)
        static = plan(model, resources(dict.fromkeys(sites, 1.0), sites), link, locus=sites[0])
        path = fleet.directory.parent / "model.json"
        path.write_text(json.dumps({"executable": "python3", "model": model.as_dict()}))
        explained = json.loads(
            fleet.ok("explain", str(path), "--json", "--broker", fleet.url(sites[0]))
        )
        weighed = explained["plan"]["candidates"]
        everyone = next(c for c in reversed(weighed) if len(c["sites"]) == len(sites))
        owner_predicted = {
            "runtime AppLeS, no selection": everyone["predicted"],
            "runtime AppLeS": explained["plan"]["predicted"],
        }
        partitions: dict[str, tuple[list[str], list[int]] | None] = {
            "blocked": (sites, blocked(model, len(sites))),
            "compile-time AppLeS": (list(static.sites), list(static.units)),
            "runtime AppLeS, no selection": (everyone["sites"], everyone["units"]),
            "runtime AppLeS": None,  # the owner's planner decides, at submission
        }
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for round_ in range(args.repeat):
            for method in METHODS:
                say(f"run {round_ + 1}/{args.repeat}: {method} ...")
                fixed = partitions[method]
                if fixed is None:
                    description: dict[str, Any] = {"model": model.as_dict()}
                else:
                    on, rows = fixed
                    description = {
                        "components": [{"cores": model.cores, "site": s} for s in on],
                        "rows": rows,
                    }
                name = f"jacobi-{METHODS.index(method)}-{round_}"
                arguments = ["--n", str(args.n), "--iterations", str(args.iterations)]
                if args.check:
                    arguments.append("--check")
                runs[method].append(run_job(fleet, home, name, arguments, description))
        rows_out: list[dict[str, Any]] = []
        by_site = {r.site: r for r in runtime}
        for method in METHODS:
            first = runs[method][0]["ranks"]
            on = [str(r["site"]) for r in first]
            rows = [int(r["rows"]) for r in first]
            # The planner's estimate of exactly these rows on the forecasts.
            unit = [by_site[s].unit_time(model) for s in on]
            comm = communication(model, on, link)
            these = model.iterations * max(
                u * a + c for u, a, c in zip(rows, unit, comm, strict=True)
            )
            measured = [run["overall"] for run in runs[method]]
            rows_out.append(
                {
                    "method": method,
                    "sites": on,
                    "rows": rows,
                    "predicted": these,
                    "owner_predicted": owner_predicted.get(method),
                    "measured": measured,
                    "measured_mean": statistics.fmean(measured),
                    "jobs": [run["id"] for run in runs[method]],
                }
            )
        report = {
            "n": args.n,
            "iterations": args.iterations,
            "repeat": args.repeat,
            "compute": compute,
            "cpu_forecast": cpu,
            "topology": args.topology.name,
            "seconds": round(time.monotonic() - began, 1),
            "methods": rows_out,
        }
    finally:
        if started:
            fleet.run("fleet", "down", "--dir", str(fleet.directory))
        shutil.rmtree(home, ignore_errors=True)  # the jobs' files: what they said is in the report
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"Jacobi2D N={args.n}, {args.iterations} iterations, {args.repeat} run(s) each; "
        f"compute {compute:.3g} CPU s/row/iteration; CPU forecast "
        + ", ".join(f"{s} {v:.2f}" for s, v in cpu.items())
    )
    print(
        f"{'method':<30} {'sites':<22} {'rows':<16} {'predicted (s)':>13} {'owner (s)':>9}"
        f" {'measured (s)':>13}"
    )
    for row in rows_out:
        spread = f"{row['measured_mean']:.2f}"
        if len(row["measured"]) > 1:
            spread += f" ({min(row['measured']):.2f}-{max(row['measured']):.2f})"
        owner = "-" if row["owner_predicted"] is None else f"{row['owner_predicted']:.2f}"
        print(
            f"{row['method']:<30} {','.join(row['sites']):<22} "
            f"{','.join(map(str, row['rows'])):<16} {row['predicted']:>13.2f} {owner:>9}"
            f" {spread:>13}"
        )
    print(f"({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
