"""Benchmark: our single-site replay against AccaSim 1.1.3, side by side, each as a whole process.

    python -m scripts.bench.bench_replay [--trace FILE] [--policy easy|fcfs] [--repeat N]
                                         [--no-peer]

For the trace (default: KTH-SP2 from ../shared/data/swf) it times, as whole processes with
start-up, imports and parsing included:
  - ours:    ``python -m gbroker replay TRACE --policy P --json``;
  - AccaSim: ``python -m scripts.experiments.peer_accasim TRACE --policy P --no-record`` (its output
  files
    off; one more untimed run records its per-job results for the figures),
and prints each wall time (best of --repeat), jobs per second and the ratio. It also measures our
peak Python heap per job with tracemalloc (SWF reading plus the replay) in this process.
AccaSim is installed with ``bash scripts/setup/setup.sh peer``; without it the peer column is
skipped with a note (or pass --no-peer).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from scripts import ROOT

DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"


def timed(cmd: list[str], repeat: int) -> tuple[float, str]:
    """Best wall time of ``repeat`` runs of ``cmd``, and the last run's stdout."""
    best = float("inf")
    out = ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} failed:\n{done.stderr}")
        best = min(best, elapsed)
        out = done.stdout
    return best, out


def heap_per_job(trace: Path, policy: str) -> tuple[int, int]:
    """Peak traced Python heap (bytes) of reading and replaying the trace, and the job count."""
    from gbroker.sim.replay import replay
    from gbroker.workloads.swf import read_swf

    tracemalloc.start()
    swf = read_swf(trace)
    result = replay(swf.jobs, swf.cores, policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, result.summary.jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--policy", choices=["easy", "fcfs"], default="easy")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; best is kept")
    parser.add_argument("--no-peer", action="store_true", help="time ours only")
    args = parser.parse_args()
    if not args.trace.exists():
        sys.exit(f"bench: trace {args.trace} not found")

    ours_cmd = [sys.executable, "-m", "gbroker", "replay", str(args.trace), "--policy", args.policy]
    ours_s, ours_out = timed([*ours_cmd, "--json"], args.repeat)
    ours = json.loads(ours_out)
    jobs = ours["jobs"]
    print(f"trace   {args.trace.name}  policy {args.policy}  jobs {jobs:,}")
    print(f"{'':10}{'wall s':>10}{'jobs/s':>12}{'avg wait':>14}{'avg bsld':>11}{'util':>9}")
    print(
        f"{'gbroker':10}{ours_s:10.3f}{jobs / ours_s:12,.0f}{ours['avg_wait']:14,.2f}"
        f"{ours['avg_bounded_slowdown']:11.2f}{ours['utilization']:9.4f}"
    )

    if args.no_peer:
        pass
    elif importlib.util.find_spec("accasim") is None:
        print("accasim    not installed: run `bash scripts/setup/setup.sh peer` to compare")
    else:
        # Timed untouched (--no-record), on the published configuration (N one-core nodes); one
        # more, untimed run records per-job results for the figures.
        peer_cmd = [
            sys.executable,
            str(ROOT / "scripts" / "experiments" / "peer_accasim.py"),
            str(args.trace),
        ]
        peer_cmd += ["--policy", args.policy]
        peer_s, _ = timed([*peer_cmd, "--no-record"], max(1, args.repeat - 1))
        _, peer_out = timed(peer_cmd, 1)
        peer = json.loads(peer_out.strip().splitlines()[-1])
        print(
            f"{'accasim':10}{peer_s:10.3f}{peer['jobs'] / peer_s:12,.0f}"
            f"{peer.get('avg_wait', float('nan')):14,.2f}"
            f"{peer.get('avg_bounded_slowdown', float('nan')):11.2f}"
            f"{peer.get('utilization', float('nan')):9.4f}"
        )
        print(f"speed-up  {peer_s / ours_s:.1f}x (AccaSim wall / gbroker wall, whole processes)")

    peak, replayed = heap_per_job(args.trace, args.policy)
    per_job = peak / replayed
    print(f"heap      {peak:,} B peak for {replayed:,} jobs = {per_job:,.0f} B/job (tracemalloc)")


if __name__ == "__main__":
    main()
