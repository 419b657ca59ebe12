"""An in-memory harness for the baselines that bind late (Sparrow, federation): one owner broker
and a few site agents, every message between them held until the test (or hypothesis) delivers
it, in any order. Input files move as a message too (a deferred placement's fetch)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gbroker.core.dispatch import (
    Abandon,
    Algorithm,
    Broker,
    BrokerCommand,
    BrokerEvent,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    RandomSource,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.model import Job, Observation
from gbroker.core.site import Claim, Fetch, Launch, Phase, SiteAgent

OWNER = "a"


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


@dataclass
class Message:
    kind: str  # dispatch, withdraw, claim, answer, fetched (input files arrived), report
    site: str  # the site it concerns
    body: Any


@dataclass
class Harness:
    """Owner ``a``; ``cores`` maps each site (``a`` among them) to its cores."""

    algorithm: Algorithm
    cores: dict[str, int]
    rng: RandomSource
    probe_ratio: float = 2.0
    stage_reservations: bool = False
    now: float = 0.0
    pending: list[Message] = field(default_factory=list)
    launched: Counter[str] = field(default_factory=Counter)
    where: dict[str, str] = field(default_factory=dict)  # running job -> its site
    fetches: list[tuple[str, str]] = field(default_factory=list)  # (job, site) granted, deferred
    submitted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        policy = DispatchPolicy(
            self.algorithm,
            probe_ratio=self.probe_ratio,
            stage_reservations=self.stage_reservations,
        )
        others = [site for site in self.cores if site != OWNER]
        self.broker = Broker(OWNER, others, policy, no_transfer, self.rng)
        self.agents = {site: SiteAgent(site, n) for site, n in self.cores.items()}

    def view(self) -> dict[str, Observation]:
        """Every site exactly as it is now (the baselines read only its size anyway)."""
        return {site: Observation(agent.state(), self.now) for site, agent in self.agents.items()}

    # -- the owner -----------------------------------------------------------------------------

    def submit(self, job: Job) -> list[BrokerCommand]:
        self.submitted.append(job.id)
        return self._owner(JobSubmitted(job))

    def _owner(self, event: BrokerEvent) -> list[BrokerCommand]:
        commands = self.broker.handle(event, self.now, self.view())
        for command in commands:
            match command:
                case Dispatch():
                    self.pending.append(Message("dispatch", command.site, command))
                case Withdraw(job_id, site):
                    self.pending.append(Message("withdraw", site, job_id))
                case ClaimAnswer(job_id, site, granted):
                    self.pending.append(Message("answer", site, (job_id, granted)))
                case Abandon():
                    raise AssertionError(f"abandoned: {command}")
        return commands

    # -- the sites -----------------------------------------------------------------------------

    def _pass(self, site: str) -> None:
        for command in self.agents[site].schedule(self.now):
            if isinstance(command, Claim):
                self.pending.append(Message("claim", site, command.job_id))
            elif isinstance(command, Launch):
                self._launched(site, command)

    def _launched(self, site: str, launch: Launch) -> None:
        self.launched[launch.job.id] += 1
        self.where[launch.job.id] = site
        self.pending.append(Message("report", site, JobStarted(launch.job.id, site)))

    def deliver(self, k: int = 0) -> Message:
        """Deliver the ``k``-th message still pending (modulo their number)."""
        message = self.pending.pop(k % len(self.pending))
        agent = self.agents[message.site]
        site = message.site
        match message.kind:
            case "dispatch":
                d: Dispatch = message.body
                # Files are instant here: staged at once (deferred: not awaited).
                if agent.stage(d.job.id) and agent.staged(
                    d.job, OWNER, d.replica, deferred=d.deferred
                ):
                    self.pending.append(Message("report", site, JobQueued(d.job.id, site)))
                self._pass(site)
            case "withdraw":
                withdrawn = agent.withdraw(message.body)
                report = WithdrawAnswered(message.body, site, withdrawn)
                self.pending.append(Message("report", site, report))
                self._pass(site)
            case "claim":
                self._owner(ClaimRequested(message.body, site))
            case "answer":
                job_id, granted = message.body
                answer = agent.claim_answered(job_id, granted)
                if isinstance(answer, Fetch):
                    self.fetches.append((job_id, site))
                    self.pending.append(Message("fetched", site, job_id))
                elif isinstance(answer, Launch):
                    self._launched(site, answer)
                else:
                    self._pass(site)
            case "fetched":
                launch = agent.fetched(message.body)
                assert launch is not None, f"{message.body} was not fetching at {site}"
                self._launched(site, launch)
            case "report":
                self._owner(message.body)
        return message

    def deliver_all(self) -> None:
        while self.pending:
            self.deliver()

    def finish(self, job_id: str) -> None:
        """The job running at its site ends; the owner hears of it."""
        site = self.where.pop(job_id)
        self.agents[site].finished(job_id)
        self.pending.append(Message("report", site, JobFinished(job_id, site)))
        self._pass(site)

    def hosting(self, job_id: str) -> dict[str, Phase]:
        """Where ``job_id`` is hosted now, with its phase at each site."""
        return {
            site: agent.hosted[job_id].phase
            for site, agent in self.agents.items()
            if job_id in agent.hosted
        }


def run_and_settle(h: Harness, steps: list[tuple[str, int]]) -> None:
    """Drive ``h`` through ``steps`` (submit a job, deliver a pending message, finish a running
    job), checking after each that no job has started twice; then deliver everything and end
    every job, and check each submitted job ran exactly once and nothing is left anywhere."""
    jobs = 0
    for action, k in steps:
        if action == "submit":
            jobs += 1
            h.submit(Job(f"a.{jobs}", 1 + k % 2))
        elif action == "deliver" and h.pending:
            h.deliver(k)
        elif action == "finish" and h.where:
            h.finish(sorted(h.where)[k % len(h.where)])
        assert max(h.launched.values(), default=0) <= 1
    while h.pending or h.where:
        h.deliver_all()
        for job_id in sorted(h.where):
            h.finish(job_id)
    assert h.launched == Counter(dict.fromkeys(h.submitted, 1))
    assert not h.broker.jobs
    assert all(not agent.hosted for agent in h.agents.values())
