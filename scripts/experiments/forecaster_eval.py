"""Where each NetMon forecaster wins: the table and the ensemble on synthetic probe series.

    python -m scripts.experiments.forecaster_eval [--json] [--seed 1] [--length 400]

Shaped links (``scripts/experiments/netmon_accuracy.py``) are steady: tbf gives every probe nearly
the same time, so any forecaster that remembers the last round is right. Real links are not. This
replays one link's probe series (seconds for an 8 MiB probe, 100 Mbit/s nominal) of five kinds,
seeded:

- **steady**: 2% Gaussian noise;
- **step**: steady, then 4x slower for a quarter of the series, then back;
- **periodic**: congestion that doubles the time for 10 of every 40 probes;
- **heavy-tailed**: steady, but 10% of probes meet a competing transfer and take 2-10x longer;
- **drift**: the time wanders (a random walk of 3% steps).

Each forecaster sees the series one probe at a time and forecasts the next; it prints the mean
and p90 relative error per forecaster and kind, and the probes the forecast needs after each
step of the *step* series to come back within 15%. The forecasters: the paper's table (alpha 1:
the last value; alpha 0.5), the ensemble (NWS: the member with the lowest recent error), and
each ensemble member alone.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Callable
from typing import Any

from netmon.ensemble import MEMBERS, Series
from netmon.forecast import PiecewiseLinearForecaster
from scripts import options

SIZE = 8 << 20
NOMINAL = SIZE / 12.5e6  # seconds at 100 Mbit/s


def traces(length: int, rng: random.Random) -> dict[str, list[float]]:
    def noisy(base: float) -> float:
        return max(1e-3, base * (1 + rng.gauss(0, 0.02)))

    quarter = length // 4
    step = [noisy(NOMINAL * (4 if quarter <= n < 2 * quarter else 1)) for n in range(length)]
    periodic = [noisy(NOMINAL * (2 if n % 40 < 10 else 1)) for n in range(length)]
    heavy = [noisy(NOMINAL) * (rng.uniform(2, 10) if rng.random() < 0.1 else 1)
             for _ in range(length)]  # fmt: skip
    level, drift = 1.0, []
    for _ in range(length):
        level = min(4.0, max(0.25, level * math.exp(rng.gauss(0, 0.03))))
        drift.append(noisy(NOMINAL * level))
    return {
        "steady": [noisy(NOMINAL) for _ in range(length)],
        "step": step,
        "periodic": periodic,
        "heavy-tailed": heavy,
        "drift": drift,
    }


def _table(alpha: float) -> Callable[[list[float]], list[float]]:
    def run(series: list[float]) -> list[float]:
        table = PiecewiseLinearForecaster(alpha=alpha)
        out = []
        for value in series:
            out.append(table.forecast("a", "b", SIZE) if table.table("a", "b") else math.nan)
            table.observe("a", "b", SIZE, value)
        return out

    return run


def _ensemble(member: str | None) -> Callable[[list[float]], list[float]]:
    def run(series: list[float]) -> list[float]:
        ensemble = Series()
        out = []
        for value in series:
            if len(ensemble) == 0:
                out.append(math.nan)
            elif member is None:
                out.append(ensemble.forecast())
            else:
                out.append(ensemble.predictions()[MEMBERS.index(member)])
            ensemble.observe(value)
        return out

    return run


def forecasters() -> dict[str, Callable[[list[float]], list[float]]]:
    found = {"table (paper, alpha=1)": _table(1.0), "table, alpha=0.5": _table(0.5),
             "ensemble": _ensemble(None)}  # fmt: skip
    found.update({f"  member {m}": _ensemble(m) for m in MEMBERS})
    return found


def _errors(forecasts: list[float], series: list[float]) -> list[float]:
    return [abs(f - x) / x for f, x in zip(forecasts, series, strict=True) if not math.isnan(f)]


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def _recovery(forecasts: list[float], series: list[float], since: int) -> int | None:
    """Probes after ``since`` until every forecast is within 15% (None: not in 50)."""
    for n in range(since, min(len(series), since + 50)):
        if all(e <= 0.15 for e in _errors(forecasts[n : since + 50], series[n : since + 50])):
            return n - since
    return None


def evaluate(length: int, seed: int) -> dict[str, Any]:
    series = traces(length, random.Random(seed))
    quarter = length // 4
    report: dict[str, Any] = {"length": length, "seed": seed, "forecasters": {}}
    for name, run in forecasters().items():
        row: dict[str, Any] = {}
        for kind, values in series.items():
            errors = _errors(run(values), values)
            row[kind] = {"mean": statistics.fmean(errors), "p90": _p90(errors)}
        step = run(series["step"])
        row["step_recovery_probes"] = [_recovery(step, series["step"], quarter),
                                       _recovery(step, series["step"], 2 * quarter)]  # fmt: skip
        report["forecasters"][name.strip()] = row
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=400, help="probes per series (400)")
    parser.add_argument("--seed", type=int, default=1)
    options.add_json(parser)
    args = parser.parse_args()
    report = evaluate(args.length, args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    kinds = list(next(iter(report["forecasters"].values())))[:-1]
    print(f"mean (p90) relative error per probe series, {args.length} probes, seed {args.seed}")
    print(f"{'forecaster':24}" + "".join(f"{k:>17}" for k in kinds) + "  step: probes back")
    for name, row in report["forecasters"].items():
        cells = "".join(f"{row[k]['mean']:>8.1%} ({row[k]['p90']:>5.1%})" for k in kinds)
        back = "/".join("-" if v is None else str(v) for v in row["step_recovery_probes"])
        print(f"{name:24}{cells}  {back:>6}")


if __name__ == "__main__":
    main()
