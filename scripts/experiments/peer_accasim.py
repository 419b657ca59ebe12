"""Run the peer simulator AccaSim 1.1.3 on an SWF trace, as one whole process.

    python -m scripts.experiments.peer_accasim TRACE [--policy easy|fcfs] [--cores N]
                                               [--record FILE]

Used by ``scripts/bench/bench_replay.py`` (timing) and ``tests/validation`` (semantics). AccaSim
runs with the FirstFit allocator on a core-only system of N one-core nodes (N default: the header's
MaxProcs), with every one of its output files off. It prints one JSON line: the jobs it finished
and, from those, average wait, average bounded slowdown (10 s) and utilization computed as GBroker
computes them. ``--record FILE`` also writes one CSV line per job: id, submit, start, end,
processors.

Per-job results are taken in memory by wrapping AccaSim's ``EventManager.finish_event`` (an append
per finished job); ``--no-record`` leaves AccaSim untouched, for pure timing.

AccaSim needs two accommodations, both outside its scheduling logic: ``collections.Mapping`` (gone
in Python 3.10) is aliased, and a gzip trace is unpacked to a temporary file because its reader
uses plain ``open``.
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

collections.Mapping = collections.abc.Mapping  # type: ignore[attr-defined]


def machine_size(trace: Path) -> int:
    opener: Any = gzip.open if trace.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(trace, "rt") as f:
        for line in f:
            if not line.startswith(";"):
                break
            key, _, value = line.lstrip("; ").partition(":")
            if key.strip() in ("MaxProcs", "MaxNodes") and value.split():
                return int(value.split()[0])
    sys.exit(f"peer_accasim: {trace} has no MaxProcs header; pass --cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--policy", choices=["easy", "fcfs"], default="easy")
    parser.add_argument("--cores", type=int)
    parser.add_argument(
        "--single-node",
        action="store_true",
        help="one node of N cores instead of N one-core nodes (same schedules, faster)",
    )
    parser.add_argument("--record", type=Path, help="write per-job CSV here")
    parser.add_argument("--no-record", action="store_true", help="time AccaSim untouched")
    args = parser.parse_args()
    cores = args.cores or machine_size(args.trace)

    from accasim.base import event_class
    from accasim.base.allocator_class import FirstFit
    from accasim.base.scheduler_class import EASYBackfilling, FirstInFirstOut
    from accasim.base.simulator_class import Simulator

    finished: list[tuple[str, int, int, int, int]] = []
    if not args.no_record:
        original = event_class.EventManager.finish_event

        def finish_event(self: Any, e: Any) -> None:
            original(self, e)
            finished.append((e.id, e.queued_time, e.start_time, e.end_time, e.requested_nodes))

        event_class.EventManager.finish_event = finish_event

    with tempfile.TemporaryDirectory(prefix="accasim-") as tmp:
        workload = Path(tmp) / "trace.swf"
        if args.trace.read_bytes()[:2] == b"\x1f\x8b":
            with gzip.open(args.trace, "rb") as src, workload.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(args.trace, workload)
        system = Path(tmp) / "system.json"
        nodes, per_node = (1, cores) if args.single_node else (cores, 1)
        system.write_text(
            json.dumps({"groups": {"g0": {"core": per_node}}, "resources": {"g0": nodes}})
        )
        dispatcher_cls = EASYBackfilling if args.policy == "easy" else FirstInFirstOut
        sim = Simulator(
            str(workload),
            str(system),
            dispatcher_cls(FirstFit()),
            RESULTS_FOLDER_PATH=str(Path(tmp) / "results"),
            LOG_LEVEL="WARNING",
            scheduling_output=False,
            pprint_output=False,
            benchmark_output=False,
            statistics_output=False,
            show_statistics=False,
        )
        sim.start_simulation()

    report: dict[str, Any] = {"peer": "accasim 1.1.3", "policy": args.policy, "cores": cores}
    report["jobs"] = sim.loaded_jobs
    if finished:
        n = len(finished)
        waits = [b - a for _, a, b, _, _ in finished]
        runs = [e - b for _, _, b, e, _ in finished]
        span = max(e for *_, e, _ in finished) - min(a for _, a, *_ in finished)
        report["finished"] = n
        report["avg_wait"] = sum(waits) / n
        report["avg_bounded_slowdown"] = (
            sum(max(1.0, (w + r) / max(r, 10)) for w, r in zip(waits, runs, strict=True)) / n
        )
        report["utilization"] = sum(r * f[4] for r, f in zip(runs, finished, strict=True)) / (
            cores * span
        )
    if args.record:
        with args.record.open("w") as out:
            out.writelines(f"{i},{a},{b},{e},{p}\n" for i, a, b, e, p in finished)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
