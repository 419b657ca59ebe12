"""SD-Policy against static EASY backfill on a Parallel Workloads Archive trace, with intervals.

    python -m scripts.experiments.exp_sdpolicy [--trace SWF] [--limit N] [--seeds 5] [--json]
                                               [--plot PNG] [--dask ADDRESS|local|serial]

The experiment of D'Amico, Jokanovic and Corbalan (ICPP 2019, §4.1 and §4.3; SEEDS §001) on one
of our traces (``../shared/data/swf/``; default KTH-SP2, 28,475 jobs on 100 processors, whose
jobs carry requested times, which SD-Policy's predictions need):

- A seeded fraction of the jobs (0, 25, 50, 100%) is made malleable: each asks its processors and
  runs on no fewer than half of them (``gbroker.sim.replay.choose_malleable``; one-processor jobs
  stay rigid). Seed k picks the malleable jobs with ``random.Random(k)``.
- Each runs through one site's EASY backfill with SD-Policy, MAX_SLOWDOWN in {5, 10, 50, inf,
  dynamic}, SharingFactor 0.5, m = 2, the ideal runtime model (the paper's §4.1 set-up), and,
  for the dynamic cut-off, the worst-case model too (its §4.3).
- The baseline is static EASY on the same trace (``gbroker replay``), which no seed changes.

Per run it measures the paper's metrics: makespan (last end − first arrival), average response
time (end − submission) and average slowdown (response / run time, over jobs that ran > 0 s),
and also the average bounded slowdown (10 s). Each is reported as its change against static
EASY (negative: SD-Policy is better), as the mean over seeds ± its 95% Student-t half-width. The
0% and 100% rows run once: no seed changes which jobs are malleable there (none; every job of
two processors or more). The 0% rows must equal static EASY.

It then looks into one run (100% malleable, MAX_SLOWDOWN 10) to show what bounds the response
time: the share of static EASY's response that is waiting, the most SD-Policy could save (every
job that waited longer than it ran, started at its arrival on half its processors, its mates
unharmed), and the change by run-time class beside each class's share of all response time.
``--exact-estimates`` replaces every requested time by the run time (the paper's Workload 2).

``--plot PNG`` draws the three metrics normalized to static EASY (the paper's Figures 1-3), with
the paper's best reported reductions as dashed lines, and the breakdown. Progress goes to stderr
on a terminal. The runs (one per configuration and seed) go to a local Dask cluster by default,
``--dask tcp://HOST:8786`` to a scheduler of one's own, ``--dask serial`` one after another
here; the figures are the same.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.core.sdpolicy import SdPolicy
from gbroker.errors import GBrokerError
from gbroker.sim.experiment import estimate
from gbroker.sim.replay import ReplayResult, choose_malleable, replay
from gbroker.sim.sweep import Run, Sweep, resolve
from gbroker.tools.progress import bar
from gbroker.workloads.swf import read_swf
from gbroker.workloads.trace import TraceJob
from scripts import ROOT, options

TRACE = ROOT.parent / "shared" / "data" / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
FRACTIONS = (0.0, 0.25, 0.5, 1.0)
CUTOFFS = ("5", "10", "50", "inf", "dynamic")
WORST_CUTOFFS = ("dynamic",)  # the paper's §4.3 compares the models under DynAVGSD
METRICS = ("makespan", "response", "slowdown", "bounded_slowdown")
# The paper's best reductions over static backfill (abstract, §4.1, §4.4): makespan 7% (the
# real run), response time 50% and slowdown 70% (CEA-Curie, simulated).
PAPER = {"makespan": 0.07, "response": 0.50, "slowdown": 0.70}


def measure(result: ReplayResult) -> dict[str, float]:
    """The paper's metrics (§4) of one run, and our bounded slowdown."""
    response = [e - j.submit for j, e in zip(result.jobs, result.end, strict=True)]
    ran = [(r, j.run_time) for r, j in zip(response, result.jobs, strict=True) if j.run_time > 0]
    s = result.summary
    return {
        "makespan": s.makespan,
        "response": sum(response) / len(response),
        "slowdown": sum(r / t for r, t in ran) / len(ran),
        "bounded_slowdown": s.avg_bounded_slowdown,
        "utilization": s.utilization,
        "shared": float(result.shared),
        "resizes": float(result.resizes),
    }


def configurations(seeds: int) -> list[tuple[str, float, str, str, int]]:
    """(label, fraction, MAX_SLOWDOWN, runtime model, seed) of every SD-Policy run."""
    out: list[tuple[str, float, str, str, int]] = []
    for fraction in FRACTIONS:
        # At 0% no job is malleable and at 100% every job of 2+ processors is, whatever the seed.
        replications = range(seeds if 0 < fraction < 1 else 1)
        for cut in CUTOFFS:
            models = ("ideal", "worst") if cut in WORST_CUTOFFS and fraction > 0 else ("ideal",)
            for model in models:
                label = f"{fraction:.0%} {cut} {model}"
                out.extend((label, fraction, cut, model, seed) for seed in replications)
    return out


CLASSES = ((0.0, 600.0, "<10 min"), (600.0, 3600.0, "10-60 min"), (3600.0, 14400.0, "1-4 h"),
           (14400.0, float("inf"), ">=4 h"))  # fmt: skip
FOCUS = "100% 10 ideal"  # the run the breakdown looks into


def breakdown(jobs: list[TraceJob], static: Times, shared: Times) -> dict[str, Any]:
    """Why the response time falls as much as it does: what share of static EASY's response is
    waiting; at most how much of it SD-Policy could save (every job of 2+ processors that
    waited longer than it ran, started at its arrival on half its processors, response 2 × run
    instead of wait + run, at no cost to its mates); and the change of response and slowdown by
    run-time class, beside each class's share of all the response time."""
    response = [e - j.submit for j, e in zip(jobs, static.end, strict=True)]
    after = [e - j.submit for j, e in zip(jobs, shared.end, strict=True)]
    wait = [b - j.submit for j, b in zip(jobs, static.start, strict=True)]
    total = sum(response)
    bound = sum(
        max(0.0, w - j.run_time) for w, j in zip(wait, jobs, strict=True) if j.processors > 1
    )
    classes = []
    for low, high, name in CLASSES:
        ks = [k for k, j in enumerate(jobs) if low <= j.run_time < high]
        if not ks:
            continue
        before, now = sum(response[k] for k in ks), sum(after[k] for k in ks)
        ran = [k for k in ks if jobs[k].run_time > 0]
        slow_before = sum(response[k] / jobs[k].run_time for k in ran)
        slow_now = sum(after[k] / jobs[k].run_time for k in ran)
        classes.append(
            {
                "run_time": name,
                "jobs": len(ks),
                "share_of_response": before / total,
                "response": now / before - 1,
                "slowdown": slow_now / slow_before - 1 if slow_before else 0.0,
            }
        )
    return {
        "run": FOCUS,
        "wait_share_of_response": sum(wait) / total,
        "most_response_saved": bound / total,
        "response_saved": 1 - sum(after) / total,
        "classes": classes,
    }


@dataclass(frozen=True, slots=True)
class Times:
    """When each job of a run started and ended (trace order): what the breakdown reads."""

    start: list[float]
    end: list[float]


def replay_once(
    jobs: list[TraceJob], cores: int, fraction: float, cut: str, model: str, seed: int, keep: bool
) -> tuple[dict[str, float], Times | None]:
    """One run of the sweep: static EASY (``cut`` empty) or SD-Policy with ``fraction`` of the
    jobs malleable (drawn from seed ``seed``); its metrics, and its times if ``keep``."""
    if not cut:
        result = replay(jobs, cores, "easy")
    else:
        malleable = choose_malleable(jobs, fraction, seed)
        policy = SdPolicy(SdPolicy.parse_max_slowdown(cut), runtime_model=model)  # type: ignore[arg-type]
        result = replay(jobs, cores, "easy", sd_policy=policy, malleable=malleable)
    return measure(result), Times(result.start, result.end) if keep else None


def run(
    jobs: list[TraceJob], cores: int, seeds: int, where: str | None, source: str
) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    configs = configurations(seeds)
    runs = [Run(f"static EASY on {source}", replay_once, (jobs, cores, 0.0, "", "", 0, True))]
    runs += [
        Run(
            f"seed {seed} of SD-Policy {label} on {source}",
            replay_once,
            (jobs, cores, fraction, cut, model, seed, label == FOCUS),
        )
        for label, fraction, cut, model, seed in configs
    ]
    with Sweep(resolve(where, len(runs))) as sweep, bar(len(runs), "exp_sdpolicy", "run") as shown:
        (base, static), *results = sweep.map(runs, shown.callback)
    assert static is not None
    focus = static
    samples: dict[str, list[dict[str, float]]] = {}
    meta: dict[str, tuple[float, str, str]] = {}
    for (label, fraction, cut, model, _), (measured, times) in zip(configs, results, strict=True):
        if times is not None:
            focus = times
        samples.setdefault(label, []).append(measured)
        meta[label] = (fraction, cut, model)
    rows: dict[str, Any] = {}
    for label, runs_of in samples.items():
        fraction, cut, model = meta[label]
        row: dict[str, Any] = {"fraction": fraction, "max_slowdown": cut, "model": model}
        for metric in METRICS:  # change against static EASY, per seed
            row[metric] = estimate([r[metric] / base[metric] - 1 for r in runs_of]).as_dict()
        row["shared"] = estimate([r["shared"] for r in runs_of]).as_dict()
        row["utilization"] = estimate([r["utilization"] for r in runs_of]).as_dict()
        rows[label] = row
    return base, rows, breakdown(jobs, static, focus)


def plot(
    rows: dict[str, Any], base: dict[str, float], why: dict[str, Any], out: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, all_axes = plt.subplots(
        1, 4, figsize=(16, 4.0), gridspec_kw={"width_ratios": [1, 1, 1, 0.8]}
    )
    axes = all_axes[:3]
    fractions = [f for f in FRACTIONS if f > 0]
    width = 0.8 / (len(fractions) + 1)
    colours = {0.25: "#9ecae1", 0.5: "#4292c6", 1.0: "#08306b"}
    for ax, metric in zip(axes, ("makespan", "response", "slowdown"), strict=True):
        for k, fraction in enumerate(fractions):
            xs, ys, errs = [], [], []
            for i, cut in enumerate(CUTOFFS):
                row = rows[f"{fraction:.0%} {cut} ideal"][metric]
                xs.append(i + (k - 1) * width)
                ys.append(1 + row["mean"])
                errs.append(row["ci95"])
            ax.bar(xs, ys, width, yerr=errs, color=colours[fraction], capsize=2,
                   label=f"{fraction:.0%} malleable")  # fmt: skip
            worst = rows[f"{fraction:.0%} dynamic worst"][metric]
            ax.bar(len(CUTOFFS) + (k - 1) * width, 1 + worst["mean"], width,
                   yerr=worst["ci95"], color=colours[fraction], hatch="//", capsize=2,
                   edgecolor="white")  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1 - PAPER[metric], color="#d62728", linestyle="--", linewidth=1.2,
                   label="paper's best")  # fmt: skip
        ax.set_xticks(range(len(CUTOFFS) + 1), [*CUTOFFS[:-1], "dyn.", "dyn.\nworst"])
        ax.set_title(
            f"{metric} (static EASY: {base[metric]:,.0f}{'' if metric == 'slowdown' else ' s'})"
        )
        ax.set_xlabel("MAX_SLOWDOWN")
        ax.set_ylim(0, 1.12)
    axes[0].set_ylabel("SD-Policy / static EASY")
    axes[0].legend(loc="lower left", fontsize=8)
    ax = all_axes[3]
    names = [c["run_time"] for c in why["classes"]]
    places = range(len(names))
    ax.bar([x - 0.2 for x in places], [100 * c["share_of_response"] for c in why["classes"]], 0.4,
           color="#bdbdbd", label="share of all response (%)")  # fmt: skip
    ax.bar([x + 0.2 for x in places], [100 * c["response"] for c in why["classes"]], 0.4,
           color="#08306b", label="response change (%)")  # fmt: skip
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(places), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax.set_xlabel("run time of the job")
    ax.set_title(
        f"{why['run']}: response saved {why['response_saved']:.0%}\n"
        f"(at most {why['most_response_saved']:.0%}, if no mate paid)",
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE, help="SWF trace (default KTH-SP2)")
    parser.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    options.add_seeds(parser, default=5)
    options.add_dask(parser)
    options.add_json(parser)
    options.add_plot(parser, "the figures normalized to static EASY")
    parser.add_argument(
        "--exact-estimates",
        action="store_true",
        help="requested time = run time for every job (the paper's Workload 2, 'Cirne_ideal')",
    )
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit takes an integer >= 1, got {args.limit}")
    try:
        trace = read_swf(args.trace, limit=args.limit)
    except OSError as exc:
        parser.error(f"--trace: cannot read {args.trace}: {exc.strerror or exc}")
    except GBrokerError as exc:  # a malformed trace: the reader names the line and field
        parser.error(f"--trace: {exc}")
    if not trace.jobs:
        parser.error(f"--trace: {args.trace} has no job to replay")
    jobs = trace.jobs
    if args.exact_estimates:
        jobs = [
            TraceJob(j.submit, j.processors, j.run_time, max(j.run_time, 1.0), j.id) for j in jobs
        ]
    total = 1 + len(configurations(args.seeds))
    began = time.monotonic()
    source = Path(trace.source).name
    base, rows, why = run(jobs, trace.cores, args.seeds, args.dask, source)
    elapsed = time.monotonic() - began
    name = Path(trace.source).name + (" (exact estimates)" if args.exact_estimates else "")
    if args.plot is not None:
        title = (
            f"SD-Policy on {name} ({len(jobs):,} jobs, {trace.cores} cores), "
            f"{args.seeds} seeds; hatched: worst-case runtime model"
        )
        plot(rows, base, why, args.plot, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        report = {
            "trace": trace.source,
            "exact_estimates": args.exact_estimates,
            "jobs": len(jobs),
            "cores": trace.cores,
            "seeds": args.seeds,
            "static_easy": base,
            "sd_policy": rows,
            "breakdown": why,
            "paper_best_reductions": PAPER,
            "seconds": elapsed,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"trace        {name}: {len(jobs):,} jobs, {trace.cores} cores")
    print(
        f"static EASY  makespan {base['makespan']:,.0f} s, response {base['response']:,.0f} s,"
        f" slowdown {base['slowdown']:,.1f}, bounded slowdown {base['bounded_slowdown']:,.1f}"
    )
    print(
        "SD-Policy    change against static EASY, mean ± 95% half-width over seeds"
        " (0% and 100%: one run, no seed changes them):"
    )
    head = "".join(f"{m.replace('_', ' '):>19}" for m in METRICS)
    print(f"{'malleable  MAX_SD   model':27}{head}{'shared jobs':>13}")
    for row in rows.values():
        cells = "".join(f"{row[m]['mean']:>+12.1%} ±{row[m]['ci95']:>5.1%}" for m in METRICS)
        print(
            f"{row['fraction']:>8.0%}  {row['max_slowdown']:>8} {row['model']:>6}"
            f"{cells}{row['shared']['mean']:>13,.0f}"
        )
    best = {
        m: min(r[m]["mean"] for r in rows.values()) for m in ("makespan", "response", "slowdown")
    }
    print(
        "\nbest here: "
        + ", ".join(f"{m} {v:+.1%}" for m, v in best.items())
        + "; the paper's best: "
        + ", ".join(f"{m} -{v:.0%}" for m, v in PAPER.items())
    )
    print(
        f"\nwhy ({why['run']}): waiting is {why['wait_share_of_response']:.0%} of static EASY's"
        f" response; SD-Policy saved {why['response_saved']:.1%} of it, and could save at most"
        f" {why['most_response_saved']:.0%} (every 2+ processor job that waited longer than it"
        " ran, started at arrival on half its processors, its mates unharmed)"
    )
    for c in why["classes"]:
        print(
            f"  run {c['run_time']:>10}: {c['jobs']:>7,} jobs,"
            f" {c['share_of_response']:>5.1%} of all response;"
            f" response {c['response']:+.1%}, slowdown {c['slowdown']:+.1%}"
        )
    print(f"\n{total} runs in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
