"""One site running rigid, moldable, malleable, evolving and adaptive jobs in virtual time.

Theory of operation. The site's :class:`~gbroker.core.localsched.LocalScheduler`, with or without
a :class:`~gbroker.core.malleable.MalleabilityPolicy`, decides every start and resize; this
driver only carries them out in virtual time, as :mod:`gbroker.sim.replay` does for rigid jobs.
Each job's work follows its speed-up model (:mod:`gbroker.workloads.speedup`): on n cores it
progresses at ``1 / run_time(n)`` of its work per second, after ``reconfiguration(n)`` seconds of
no progress at its start and at every change of size. Evolving jobs (and adaptive ones, which
are malleable too) ask for a new size at the start of each iteration
(:meth:`LocalScheduler.request`: shrinks granted, growth up to the free cores). Every change
reschedules the job's next event; events of an older schedule are recognised and dropped.

Job kinds (ElastiSim's): ``rigid`` on its size; ``moldable`` sized at start; ``malleable``
resized by the scheduler; ``evolving`` resized at its own request; ``adaptive`` both. With
``hold_rigid`` every job keeps the size it starts with and no request is made: the baseline
a malleability policy is measured against.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gbroker.core.localsched import LocalScheduler, QueuePolicy, ResizeJob, StartJob
from gbroker.core.malleable import Initiative, Malleability, MalleabilityPolicy
from gbroker.core.model import Job, JobClass
from gbroker.errors import InternalError, InvalidInput
from gbroker.sim.kernel import Kernel
from gbroker.workloads.speedup import (
    ElastiSimApplication,
    ElastiSimPlatform,
    SpeedupModel,
    load_model,
)

__all__ = ["ElasticJob", "ElasticResult", "load_elastisim", "simulate"]

KINDS = ("rigid", "moldable", "malleable", "evolving", "adaptive")
_COMPLETION, _ITERATION, _ARRIVAL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """A job of a malleable workload: when it comes, its kind, its size bounds, its work."""

    id: str
    submit: float
    kind: str
    min_cores: int
    max_cores: int
    model: SpeedupModel
    iterations: int = 1
    requested: float | None = None  # the user's estimate on max_cores (default: the model's)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInput(f"job[{self.id}].type", f"one of {', '.join(KINDS)}", self.kind)
        if not 1 <= self.min_cores <= self.max_cores:
            raise InvalidInput(
                f"job[{self.id}].num_nodes_max",
                f">= num_nodes_min ({self.min_cores})",
                self.max_cores,
            )
        if self.kind == "rigid" and self.min_cores != self.max_cores:
            raise InvalidInput(
                f"job[{self.id}].num_nodes", "one size for a rigid job", self.max_cores
            )

    def as_core_job(self, hold_rigid: bool) -> Job:
        planned = self.model.run_time(self.min_cores)
        if self.requested is not None:  # restated for min_cores, linearly as the plans assume
            planned = self.requested * self.max_cores / self.min_cores
        if self.kind == "rigid":
            return Job(self.id, self.min_cores, planned)
        if self.kind == "moldable" or hold_rigid:
            return Job(self.id, self.min_cores, planned, JobClass.MOLDABLE, self.max_cores)
        initiative = {
            "malleable": Initiative.SCHEDULER,
            "evolving": Initiative.APPLICATION,
            "adaptive": Initiative.BOTH,
        }[self.kind]
        declared = Malleability(initiative=initiative, evolving=self.kind != "malleable")
        return Job(
            self.id,
            self.min_cores,
            planned,
            JobClass.MALLEABLE,
            self.max_cores,
            malleability=declared,
        )


@dataclass(slots=True)
class _Running:
    job: ElasticJob
    cores: int
    progress: float = 0.0  # fraction of the work done
    last: float = 0.0  # when progress was last brought up to date
    resumes: float = 0.0  # no progress before this (start-up or reconfiguration)
    version: int = 0  # the current schedule of its events
    history: list[tuple[float, int]] = field(default_factory=list)

    def advance(self, now: float) -> None:
        begin = max(self.last, self.resumes)
        if now > begin:
            self.progress = min(
                1.0, self.progress + (now - begin) / self.job.model.run_time(self.cores)
            )
        self.last = now


@dataclass(frozen=True, slots=True)
class Outcome:
    job: ElasticJob
    start: float
    end: float
    history: tuple[tuple[float, int], ...]  # (when, cores) of each size it had

    @property
    def wait(self) -> float:
        return self.start - self.job.submit

    @property
    def turnaround(self) -> float:
        return self.end - self.job.submit


@dataclass(frozen=True, slots=True)
class ElasticResult:
    cores: int
    outcomes: tuple[Outcome, ...]

    @property
    def makespan(self) -> float:
        return max(o.end for o in self.outcomes) - min(o.job.submit for o in self.outcomes)

    @property
    def mean_wait(self) -> float:
        return sum(o.wait for o in self.outcomes) / len(self.outcomes)

    @property
    def mean_turnaround(self) -> float:
        return sum(o.turnaround for o in self.outcomes) / len(self.outcomes)

    @property
    def utilization(self) -> float:
        """Core-seconds allocated over cores × makespan."""
        used = 0.0
        for o in self.outcomes:
            for (at, cores), (until, _) in zip(
                o.history, (*o.history[1:], (o.end, 0)), strict=True
            ):
                used += cores * (until - at)
        return used / (self.cores * self.makespan)

    def resizes(self) -> int:
        return sum(len(o.history) - 1 for o in self.outcomes)

    def summary(self) -> dict[str, float]:
        return {
            "jobs": len(self.outcomes),
            "makespan_s": self.makespan,
            "mean_wait_s": self.mean_wait,
            "mean_turnaround_s": self.mean_turnaround,
            "utilization": self.utilization,
            "resizes": self.resizes(),
        }


def simulate(
    jobs: Sequence[ElasticJob],
    cores: int,
    malleability: MalleabilityPolicy | None,
    queue: QueuePolicy | str = QueuePolicy.FCFS,
    *,
    hold_rigid: bool = False,
) -> ElasticResult:
    """Run ``jobs`` on one site of ``cores`` cores; see the module docstring."""
    if not jobs:
        raise InvalidInput("jobs", "at least one job", 0)
    for job in jobs:
        if job.min_cores > cores:
            raise InvalidInput(f"job[{job.id}].num_nodes_min", f"at most {cores}", job.min_cores)
    scheduler = LocalScheduler(cores, queue, None if hold_rigid else malleability)
    kernel = Kernel(start=min(j.submit for j in jobs))
    running: dict[str, _Running] = {}
    starts: dict[str, float] = {}
    done: list[Outcome] = []
    by_id = {j.id: j for j in jobs}
    pass_posted = False

    def request_pass() -> None:
        nonlocal pass_posted
        if not pass_posted:
            pass_posted = True
            kernel.defer(schedule_pass)

    def plan(run: _Running) -> None:
        """Schedule the job's next event: its end, or (evolving) its next iteration."""
        run.version += 1
        model = run.job.model
        begin = max(kernel.now, run.resumes)
        asks = not hold_rigid and run.job.kind in ("evolving", "adaptive")
        if asks and run.job.iterations > 1:
            boundary = (
                math.floor(run.progress * run.job.iterations + 1e-9) + 1
            ) / run.job.iterations
        else:
            boundary = 1.0
        at = begin + (min(boundary, 1.0) - run.progress) * model.run_time(run.cores)
        if boundary >= 1.0 - 1e-12:
            kernel.at(at, complete, (run.job.id, run.version), _COMPLETION)
        else:
            kernel.at(at, iteration, (run.job.id, run.version), _ITERATION)

    def arrive(job: ElasticJob) -> None:
        scheduler.submit(job.as_core_job(hold_rigid))
        request_pass()

    def complete(payload: tuple[str, int]) -> None:
        job_id, version = payload
        run = running.get(job_id)
        if run is None or run.version != version:
            return
        del running[job_id]
        scheduler.finish(job_id)
        done.append(Outcome(run.job, starts[job_id], kernel.now, tuple(run.history)))
        request_pass()

    def iteration(payload: tuple[str, int]) -> None:
        job_id, version = payload
        run = running.get(job_id)
        if run is None or run.version != version:
            return
        run.advance(kernel.now)
        model = run.job.model
        index = round(run.progress * run.job.iterations)
        wanted = (
            model.evolving_request(index, run.cores)
            if isinstance(model, ElastiSimApplication)
            else None
        )
        change = scheduler.request(job_id, wanted, kernel.now) if wanted is not None else None
        if change is not None:
            resized(run, change.cores)
            request_pass()  # a shrink freed cores
        plan(run)

    def resized(run: _Running, cores: int) -> None:
        now = kernel.now
        run.advance(now)
        run.cores = cores
        run.resumes = now + run.job.model.reconfiguration(cores)
        run.history.append((now, cores))

    def schedule_pass() -> None:
        nonlocal pass_posted
        pass_posted = False
        now = kernel.now
        for command in scheduler.schedule(now):
            if isinstance(command, StartJob):
                job = by_id[command.job.id]
                run = _Running(job, command.cores, last=now)
                run.resumes = now + job.model.reconfiguration(command.cores)
                run.history.append((now, command.cores))
                running[job.id] = run
                starts[job.id] = now
                plan(run)
            elif isinstance(command, ResizeJob):
                run = running[command.job_id]
                resized(run, command.cores)
                plan(run)
            else:
                raise InternalError(f"unknown scheduler command {command}")

    for job in jobs:
        kernel.at(job.submit, arrive, job, _ARRIVAL)
    kernel.run()
    if len(done) != len(jobs):
        raise InternalError(f"{len(jobs) - len(done)} jobs never ended")
    done.sort(key=lambda o: (o.job.submit, o.job.id))
    return ElasticResult(cores, tuple(done))


def load_elastisim(directory: str | Path) -> tuple[list[ElasticJob], ElastiSimPlatform]:
    """ElastiSim's example project: ``jobs.json``, its application model and ``crossbar.xml``
    (``configuration.json`` names the files; they are looked up in ``directory``)."""
    root = Path(directory)
    try:
        config = json.loads((root / "configuration.json").read_text())
        platform = ElastiSimPlatform.load(root / Path(config["platform_file"]).name)
        raw = json.loads((root / Path(config["jobs_file"]).name).read_text())["jobs"]
    except (OSError, KeyError, ValueError) as exc:
        raise InvalidInput(
            str(root), "an ElastiSim project (configuration.json, ...)", exc
        ) from None
    models: dict[str, dict[str, Any]] = {}
    jobs = []
    for k, spec in enumerate(raw):
        name = Path(spec["application_model"]).name
        if name not in models:
            models[name] = load_model(root / name)
        app = ElastiSimApplication.from_model(models[name], spec["arguments"], platform)
        lo = spec.get("num_nodes", spec.get("num_nodes_min"))
        hi = spec.get("num_nodes", spec.get("num_nodes_max"))
        jobs.append(
            ElasticJob(
                f"e{k}",
                float(spec["submit_time"]),
                spec["type"],
                int(lo),
                int(hi),
                app,
                app.iterations,
            )
        )
    return jobs, platform
