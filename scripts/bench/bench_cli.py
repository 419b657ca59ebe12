"""How fast the ``gbroker`` command is as a process, beside Slurm's ``sbatch``, in the same run.

    python -m scripts.bench.bench_cli [--calls 500] [--json]

A user (or a script's loop) submits one job per process: what counts is the whole process, from
``fork``/``exec`` to its exit, the submission acknowledged (durable at the broker, queued at
slurmctld). This script starts both systems itself:

- GBroker: a one-site local fleet (:func:`gbroker.fleet.up`, what ``gbroker fleet up`` runs, 64
  cores) in a temporary directory, found by the client through
  ``$GBROKER_FLEET`` as a user's own would be (no URL or token given);
- Slurm: a single-node Slurm from Debian's ``slurm-wlm`` (:mod:`bench_slurm`, the same one
  ``bench_daemon.py`` uses; ``bash scripts/setup/ensure_slurm.sh`` installs it), the tuned variant.

It then runs ``--calls`` sequential ``gbroker submit job.yaml`` processes and as many ``sbatch
--wrap /bin/true`` ones, interleaved in blocks of 25 (A, B, A, B, ...) so that a drift in the
machine's load hits both alike, each process started by the same ``subprocess.run`` loop.
``gbroker`` is the command ``scripts/setup/setup.sh`` installs: its native front
(``gbroker/cli/native/gbroker.c``) when it was built, which submits without starting Python; the
Python CLI's own submission (``GBROKER_NO_NATIVE=1``) is timed beside it. The job is ``/bin/true``
on one core for both. It prints each one's time per call (median, mean, 90th percentile), calls per
second, and the ratio gbroker/sbatch per call (below 1: gbroker is faster), with the interpreter's
own start (``python -I -S -c pass``) and ``status`` / ``jobs --json`` for scale. Nothing is kept:
both systems are stopped and their directories removed, however the run ends (Ctrl-C, SIGTERM
and SIGHUP included: scripts/orderly.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts import options, orderly
from scripts.bench.bench_slurm import TUNED, _tool, ensure_installed, running

BLOCK = 25
JOB = "executable: /bin/true\ntotal_cpu_count: {exact: 1}\n"


def gbroker_command() -> str:
    """The ``gbroker`` console script beside this interpreter (what a user's shell runs)."""
    script = Path(sys.executable).parent / "gbroker"
    if not script.exists():
        raise SystemExit(f"bench_cli: {script} is missing: run `bash scripts/setup/setup.sh` first")
    return str(script)


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"bench_cli: {command[0]} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def summary(name: str, seconds: list[float]) -> dict[str, float | str | int]:
    ordered = sorted(seconds)
    return {
        "command": name,
        "calls": len(seconds),
        "median_ms": statistics.median(ordered) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3,
        "calls_per_s": len(seconds) / sum(seconds),
    }


def _measure(
    calls: int, gbroker: str, job: Path, env: dict[str, str], slurm_env: dict[str, str], work: Path
) -> dict[str, list[float]]:
    """Seconds per process of each command, ``calls`` each, interleaved in blocks."""
    sbatch = [_tool("sbatch"), "--wrap", "/bin/true", "--output", "/dev/null"]
    ours = [gbroker, "submit", str(job)]
    floor = [sys.executable, "-I", "-S", "-c", "pass"]
    python_env = {**env, "GBROKER_NO_NATIVE": "1"}
    for command, where in ((ours, env), (ours, python_env), (sbatch, slurm_env)):
        for _ in range(5):  # warm the caches
            timed(command, where, work)
    python = "python -I -S -c pass"
    in_python = "gbroker submit, Python CLI"
    times: dict[str, list[float]] = {
        "gbroker submit": [],
        "sbatch": [],
        in_python: [],
        python: [],
    }
    while len(times["sbatch"]) < calls:
        n = min(BLOCK, calls - len(times["sbatch"]))
        times["gbroker submit"] += [timed(ours, env, work) for _ in range(n)]
        times["sbatch"] += [timed(sbatch, slurm_env, work) for _ in range(n)]
        times[in_python] += [timed(ours, python_env, work) for _ in range(n)]
        times[python] += [timed(floor, env, work) for _ in range(n)]
    # For scale: the other quick commands, a tenth as often.
    some = max(5, calls // 10)
    job_id = subprocess.run(ours, env=env, capture_output=True, text=True).stdout.strip()
    times["gbroker status --json"] = [
        timed([gbroker, "status", job_id, "--json"], env, work) for _ in range(some)
    ]
    times["gbroker status (table)"] = [
        timed([gbroker, "status", job_id], env, work) for _ in range(some)
    ]
    times["gbroker jobs --json --limit 20"] = [
        timed([gbroker, "jobs", "--json", "--limit", "20"], env, work) for _ in range(some)
    ]
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--calls", type=int, default=500, help="processes of each (default 500)")
    options.add_json(parser)
    args = parser.parse_args()
    ensure_installed()
    gbroker = gbroker_command()
    with orderly.temporary_directory("gbroker-bench-cli-") as work:
        # The fleet's brokers (started from here) and the clients: nothing of the user's.
        for name in [name for name in os.environ if name.startswith("GBROKER_")]:
            del os.environ[name]
        os.environ["GBROKER_RUNTIME_DIR"] = str(work / "runtime")
        os.environ["XDG_STATE_HOME"] = str(work / "state")  # not the user's default fleet
        fleet = work / "fleet"
        topology = work / "one.yaml"
        topology.write_text("name: one\nneighbourhood: full\nsites:\n  - {name: solo, cores: 64}\n")
        env = {**os.environ, "GBROKER_FLEET": str(fleet)}
        job = work / "job.yaml"
        job.write_text(JOB)
        (work / "slurm").mkdir()
        with orderly.fleet(topology, fleet), running(work / "slurm", 64, TUNED) as slurm:
            times = _measure(args.calls, gbroker, job, env, slurm.env, work)
    rows = [summary(name, seconds) for name, seconds in times.items()]
    by_name = {str(r["command"]): r for r in rows}
    ratio = float(by_name["gbroker submit"]["median_ms"]) / float(by_name["sbatch"]["median_ms"])
    mean_ratio = float(by_name["gbroker submit"]["mean_ms"]) / float(by_name["sbatch"]["mean_ms"])
    if args.json:
        figures = {"rows": rows, "ratio_median": ratio, "ratio_mean": mean_ratio}
        print(json.dumps({**figures, "native": Path(gbroker).read_bytes()[:4] == b"\x7fELF"}))
        return 0
    native = Path(gbroker).read_bytes()[:4] == b"\x7fELF"
    print(f"{args.calls} sequential processes each, interleaved in blocks of {BLOCK}")
    print(f"gbroker: {gbroker} ({'the native front' if native else 'the Python CLI only'})")
    print(f"{'command':34} {'median':>9} {'mean':>9} {'p90':>9} {'calls/s':>9}")
    for row in rows:
        print(
            f"{row['command']!s:34} {row['median_ms']:>7.1f}ms {row['mean_ms']:>7.1f}ms"
            f" {row['p90_ms']:>7.1f}ms {row['calls_per_s']:>9.1f}"
        )
    verdict = "faster than" if ratio < 1 else "slower than"
    print(
        f"gbroker submit / sbatch per call: {ratio:.2f} (median), {mean_ratio:.2f} (mean):"
        f" gbroker submit is {verdict} sbatch"
    )
    return 0


if __name__ == "__main__":
    orderly.run(main)
