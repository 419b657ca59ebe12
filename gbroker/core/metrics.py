"""Metrics over served jobs (ARCHITECTURE §8), pure functions shared by every driver.

For M jobs with arrival a_k, start b_k and end e_k, over the span τ from the first arrival to the
last end: throughput B = M/τ; mean service time T = mean(e_k − a_k); mean wait W = mean(b_k − a_k);
bounded slowdown per job max(1, (wait + run) / max(run, threshold)) with threshold 10 s by default;
utilization = sum(run × cores) / (total cores × τ); makespan = τ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gbroker.errors import InvalidInput

__all__ = ["BSLD_THRESHOLD", "Summary", "summarize"]

BSLD_THRESHOLD = 10.0


@dataclass(frozen=True, slots=True)
class Summary:
    jobs: int
    avg_wait: float
    avg_bounded_slowdown: float
    avg_service_time: float
    utilization: float
    makespan: float
    throughput: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(
    submit: Sequence[float],
    start: Sequence[float],
    end: Sequence[float],
    cores: Sequence[int],
    total_cores: int,
    bsld_threshold: float = BSLD_THRESHOLD,
    *,
    core_seconds: Sequence[float] | None = None,
) -> Summary:
    """Summarise served jobs given per-job arrival, start, end and allocated cores.

    ``core_seconds``, when given, replaces run × cores per job in the utilization (jobs whose
    size changed while they ran)."""
    m = len(submit)
    if not (len(start) == len(end) == len(cores) == m):
        raise InvalidInput("summarize", "sequences of equal length", (m, len(start), len(end)))
    if total_cores < 1:
        raise InvalidInput("total_cores", "an integer >= 1", total_cores)
    if m == 0:
        return Summary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    wait_sum = bsld_sum = service_sum = used = 0.0
    first_submit = min(submit)
    last_end = max(end)
    for a, b, e, p in zip(submit, start, end, cores, strict=True):
        wait = b - a
        run = e - b
        wait_sum += wait
        service_sum += e - a
        used += run * p
        bsld = (wait + run) / max(run, bsld_threshold)
        bsld_sum += bsld if bsld > 1.0 else 1.0
    span = last_end - first_submit
    if core_seconds is not None:
        if len(core_seconds) != m:
            raise InvalidInput("core_seconds", f"one per job ({m})", len(core_seconds))
        used = sum(core_seconds)
    return Summary(
        jobs=m,
        avg_wait=wait_sum / m,
        avg_bounded_slowdown=bsld_sum / m,
        avg_service_time=service_sum / m,
        utilization=used / (total_cores * span) if span > 0 else 0.0,
        makespan=span,
        throughput=m / span if span > 0 else 0.0,
    )
