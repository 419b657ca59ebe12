"""Draw a site's cores over time as a PNG: each job a band as tall as its cores, grows and shrinks.

    python -m scripts.experiments.gantt --elastisim OUT.png [--data DIR]
                                        (ElastiSim's workload, FCFS)
    python -m scripts.experiments.gantt --journal JOURNAL OUT.png [--site SITE] [--cores N]
                                        (a real broker's jobs, from its journal)

:func:`draw` takes anything with ``job.id``, ``job.kind`` (rigid, moldable, malleable, evolving,
adaptive), ``history`` (``(when, cores)`` of each size) and ``end``: a simulation's outcomes
(:mod:`gbroker.sim.elastic`) or, through :func:`from_journal`, a real broker's allocation
history. Jobs are stacked in the order they started (a band's height is its cores: it steps up
when the job grows, down when it shrinks, and the bands above it drop when a job below ends);
rigid jobs are dark blue, moldable light blue, malleable orange, adaptive red, evolving green.
"""

from __future__ import annotations

import argparse
import itertools
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from scripts import ROOT

COLOURS = {
    "rigid": "#4c72b0",
    "moldable": "#64b5cd",
    "malleable": "#dd8452",
    "adaptive": "#c44e52",
    "evolving": "#55a868",
}


@dataclass(frozen=True)
class _Job:
    id: str
    kind: str


@dataclass(frozen=True)
class _Ran:
    """A job a broker owned, as its journal tells it (a :class:`Drawn`)."""

    job: _Job
    history: tuple[tuple[float, int], ...]
    end: float


def from_journal(path: Path, site: str | None = None) -> list[_Ran]:
    """The jobs an owner's journal (``DATA_DIR/journal.sqlite``) shows started and ended (at
    ``site``, if given): each with its allocation history (its start, then each resize its site
    reported), times relative to the first start."""
    import msgpack

    from gbroker.jobs.mapping import from_mapping

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        jobs = conn.execute(
            "SELECT id, site, spec, started_at, ended_at FROM jobs"
            " WHERE started_at IS NOT NULL AND ended_at IS NOT NULL ORDER BY started_at"
        ).fetchall()
        sizes: dict[str, list[tuple[float, int]]] = {}
        for job_id, at, cores in conn.execute(
            "SELECT job_id, at, cores FROM allocations ORDER BY rowid"
        ):
            sizes.setdefault(job_id, []).append((at, cores))
    if not jobs:
        return []
    origin = min(started for _, _, _, started, _ in jobs)
    out = []
    for job_id, where, spec, started, ended in jobs:
        if site is not None and where != site:
            continue
        desc = from_mapping(msgpack.unpackb(spec), document=f"job {job_id}")
        rank, _, kind = desc.core_request()
        history = sizes.get(job_id) or [(started, rank)]
        steps = [(max(at, started) - origin, cores) for at, cores in history if at < ended]
        out.append(_Ran(_Job(job_id, str(kind)), tuple(steps), ended - origin))
    return out


class Drawn(Protocol):
    @property
    def job(self) -> Any: ...

    @property
    def history(self) -> Sequence[tuple[float, int]]: ...

    @property
    def end(self) -> float: ...


def draw(
    outcomes: Sequence[Drawn],
    out: Path,
    *,
    title: str = "",
    total: int | None = None,
    unit: str = "h",
) -> None:
    """``unit``: the time axis in hours (``h``, a workload) or seconds (``s``, a real run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ordered = sorted(outcomes, key=lambda o: (o.history[0][0], str(o.job.id)))
    times = sorted({t for o in ordered for t, _ in o.history} | {o.end for o in ordered})
    index = {t: i for i, t in enumerate(times)}
    base = [0] * len(times)
    fig, ax = plt.subplots(figsize=(12, 5))
    for o in ordered:
        sizes = [0] * len(times)
        steps = [*o.history, (o.end, 0)]
        for (at, cores), (until, _) in itertools.pairwise(steps):
            for i in range(index[at], index[until]):
                sizes[i] = cores
        top = [b + s for b, s in zip(base, sizes, strict=True)]
        colour = COLOURS.get(str(getattr(o.job, "kind", "rigid")), "#8c8c8c")
        scaled = [t / 3600 for t in times] if unit == "h" else times
        ax.fill_between(
            scaled, base, top, step="post", color=colour, linewidth=0.2, edgecolor="white"
        )
        base = top
    if total is not None:
        ax.axhline(total, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("cores (nodes) allocated")
    ax.set_title(title)
    kinds = sorted({str(getattr(o.job, "kind", "rigid")) for o in ordered})
    ax.legend(
        handles=[Patch(color=COLOURS.get(k, "#8c8c8c"), label=k) for k in kinds],
        loc="upper right",
        fontsize=8,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument(
        "--elastisim",
        action="store_true",
        help="run ElastiSim's example workload (FCFS + malleability) and draw it",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT.parent / "shared" / "data" / "elastisim",
        help="the ElastiSim project (default: ../shared/data/elastisim)",
    )
    parser.add_argument(
        "--journal", type=Path, help="a broker's journal (DATA_DIR/journal.sqlite): its jobs"
    )
    parser.add_argument("--site", help="with --journal: only the jobs that ran at SITE")
    parser.add_argument("--cores", type=int, help="with --journal: the site's cores (a line)")
    args = parser.parse_args(argv)
    if args.journal is not None:
        if not args.journal.is_file():
            parser.error(f"--journal: no such file: {args.journal}")
        ran = from_journal(args.journal, args.site)
        if not ran:
            print(f"{args.journal}: no job has both started and ended", file=sys.stderr)
            return 1
        where = f" at {args.site}" if args.site else ""
        title = f"jobs{where}, from a broker's journal ({args.journal.name})"
        draw(ran, args.out, title=title, total=args.cores, unit="s")
        print(f"wrote {args.out} ({len(ran)} jobs)")
        return 0
    if not args.elastisim:
        parser.error("give --elastisim or --journal")
    from gbroker.core.malleable import MalleabilityPolicy
    from gbroker.sim.elastic import load_elastisim, simulate

    jobs, platform = load_elastisim(args.data)
    policy = MalleabilityPolicy("fpsma", "pwa", shrink_for_head=False)  # type: ignore[arg-type]
    result = simulate(jobs, platform.nodes, policy)
    draw(
        result.outcomes,
        args.out,
        title="ElastiSim's example workload, FCFS + malleability",
        total=platform.nodes,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
