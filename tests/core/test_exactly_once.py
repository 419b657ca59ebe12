"""Exactly once, model-checked: the launch protocol under any interleaving of crashes and messages.

A hypothesis state machine runs the core's :class:`Broker` (the owner, at site ``a``) and two
:class:`SiteAgent` s (``a`` and ``b``, claiming every start as the daemon's do) with a model of
what the daemon adds around them, rule for rule as :mod:`gbroker.daemon.driver` and
:mod:`gbroker.daemon.recovery` do it:

- journals that survive a crash: the owner's placements and grants (a placement journaled
  before its dispatch is sent, a grant before the claim is answered), and each site's hosted
  jobs with their phase and launch token (``launching`` journaled before the start request
  leaves);
- the launcher, which outlives brokers: start requests wait in its socket, and it records a
  launch under its token only if no record of that token exists (``O_EXCL``); its jobs run on
  and end whether or not their broker is there;
- messages delivered in any order, requests retried until the peer is up, answers lost when
  the caller crashed first, dispatches that "fail" after or before they arrived, and the owner
  suspecting a site (a last-will, a failed call) at any moment, rightly or not, with any lease
  run out.

Each step the machine checks that no job's process was started twice. At the end it restarts
every node, delivers everything and lets every job end, then checks that every job submitted
ran exactly once and its owner recorded it done: none lost, none twice.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gbroker.core.dispatch import (
    Abandon,
    Algorithm,
    Broker,
    BrokerCommand,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Kill,
    SiteBack,
    SiteLost,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.site import Claim, Launch, SiteAgent

LEASE = 10.0
CORES = 2
SITES = ("a", "b")
OWNER = "a"


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


@dataclass
class Message:
    kind: str  # accept, claim, report, withdraw (requests); answer (to a request)
    src: str
    dst: str
    body: dict[str, Any]
    gen: int = 0  # the sender's generation (a request's answer goes back to it alone)


@dataclass
class Node:
    """One ``gbroker serve``: the owner of its jobs (node a only) and a site."""

    name: str
    up: bool = True
    gen: int = 0
    broker: Broker | None = None
    agent: SiteAgent | None = None
    # Durable: the site's hosted jobs (journal), its launcher's records and processes.
    hosted: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)  # token -> started | void
    processes: dict[str, str] = field(default_factory=dict)  # job id -> token, running
    ended: set[str] = field(default_factory=set)  # ended while nobody watched (exit files)


class Protocol(RuleBasedStateMachine):
    policy = DispatchPolicy(Algorithm.DLO)

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.nodes = {name: Node(name) for name in SITES}
        self.owned: dict[str, dict[str, Any]] = {}  # the owner's journal
        self.jobs: dict[str, Job] = {}
        self.messages: list[Message] = []
        self.spawns: list[tuple[str, str, str]] = []  # (site, job id, token) in the socket
        self.runs: Counter[str] = Counter()  # process starts, by job id
        self.view = {s: Observation(SiteState(CORES, CORES), 0.0) for s in SITES}
        self.tokens = itertools.count()
        self.ids = itertools.count()
        for node in self.nodes.values():
            self._boot(node)

    # -- the owner (node a) ------------------------------------------------------------------

    @property
    def owner(self) -> Node:
        return self.nodes[OWNER]

    def _carry_out(self, commands: list[BrokerCommand]) -> None:
        for command in commands:
            match command:
                case Dispatch(job, site, replica):
                    self.owned[job.id]["placements"][site] = False  # journaled, then sent
                    self._send("accept", OWNER, site, id=job.id, replica=replica)
                case Withdraw(job_id, site):
                    self._send("withdraw", OWNER, site, id=job_id)
                case Abandon(job_id, _):
                    self.owned[job_id]["state"] = "failed"
                case ClaimAnswer() | Kill():
                    pass  # answered by the claim's handler; nothing is cancelled here

    def _to_broker(self, event: Any) -> list[BrokerCommand]:
        assert self.owner.broker is not None
        return self.owner.broker.handle(event, self.now, self.view)

    @rule(rank=st.integers(1, 2))
    @precondition(lambda self: self.owner.up and len(self.jobs) < 6)
    def submit(self, rank: int) -> None:
        job = Job(f"a.{next(self.ids)}", rank)
        self.jobs[job.id] = job
        self.owned[job.id] = {"placements": {}, "granted": None, "state": "active"}
        self._carry_out(self._to_broker(JobSubmitted(job)))

    def _owner_handles(self, message: Message) -> None:
        body, site = message.body, message.src
        job_id = body["id"]
        record = self.owned.get(job_id)
        if message.kind == "claim":
            commands = self._to_broker(ClaimRequested(job_id, site))
            granted = any(
                isinstance(c, ClaimAnswer) and c.site == site and c.granted for c in commands
            )
            if granted:
                assert record is not None
                record["granted"] = site  # journaled before the site hears it
            self._carry_out(commands)
            self._answer(message, granted=granted)
            return
        if message.kind != "report":
            raise AssertionError(message)
        broker = self.owner.broker
        assert broker is not None
        if record is None or record["state"] != "active" or not broker.placed(job_id, site):
            self._answer(message)  # a repeat, or a stale site's: acknowledged, nothing changes
            return
        if body["kind"] == "queued":
            self._to_broker(JobQueued(job_id, site))
            record["placements"][site] = True
        elif body["kind"] == "started":
            self._to_broker(JobStarted(job_id, site))
            record["granted"] = site
        else:
            self._carry_out(self._to_broker(JobFinished(job_id, site, True)))
            record["state"] = "done"
        self._answer(message)

    def _owner_hears_withdrawal(self, job_id: str, site: str, withdrawn: bool) -> None:
        if withdrawn:
            self.owned[job_id]["placements"].pop(site, None)
        self._carry_out(self._to_broker(WithdrawAnswered(job_id, site, withdrawn)))

    @rule()
    @precondition(lambda self: self.owner.up)
    def tick(self) -> None:
        self.now += 1.0
        self._carry_out(self._to_broker(Tick()))

    @rule(site=st.sampled_from(SITES), free=st.integers(0, CORES), queued=st.integers(0, 3))
    def observe(self, site: str, free: int, queued: int) -> None:
        """DCSMon: a new, possibly stale, view of a site (what makes DM migrate)."""
        self.view[site] = Observation(SiteState(CORES, free, queued), self.now)

    @rule(expired=st.booleans())
    @precondition(lambda self: self.owner.up)
    def suspect_b(self, expired: bool) -> None:
        """Site b is taken for lost (its last-will; a call to it failed), rightly or not."""
        if expired:
            self.now += LEASE + 1
        self._carry_out(self._to_broker(SiteLost("b")))

    @rule()
    @precondition(lambda self: self.owner.up)
    def b_is_back(self) -> None:
        self._to_broker(SiteBack("b"))

    # -- a site ------------------------------------------------------------------------------

    def _site_handles(self, node: Node, message: Message) -> None:
        agent, body = node.agent, message.body
        assert agent is not None
        job_id = body["id"]
        if message.kind == "accept":
            if job_id not in node.hosted:
                node.hosted[job_id] = {"replica": body["replica"], "phase": "queued"}
                agent.accept(self.jobs[job_id], OWNER, body["replica"], lease_until=LEASE)
                self._send("report", node.name, OWNER, id=job_id, kind="queued")
            self._schedule(node)
        elif message.kind == "withdraw":
            withdrawn = agent.withdraw(job_id)
            if withdrawn:
                node.hosted.pop(job_id, None)
                self._schedule(node)
            self._answer(message, withdrawn=withdrawn)
        else:
            raise AssertionError(message)

    def _schedule(self, node: Node) -> None:
        assert node.agent is not None
        for command in node.agent.schedule(self.now):
            assert isinstance(command, Claim), "a start without its owner's grant"
            self._send("claim", node.name, OWNER, id=command.job_id)

    def _site_hears(self, node: Node, request: Message, answer: dict[str, Any]) -> None:
        """The answer to a call the site made (a claim, or a report)."""
        job_id = request.body["id"]
        assert node.agent is not None
        if request.kind == "claim":
            launch = node.agent.claim_answered(job_id, answer["granted"])
            if isinstance(launch, Launch):
                token = f"t{next(self.tokens)}"
                node.hosted[job_id].update(phase="launching", token=token)  # journaled first
                self.spawns.append((node.name, job_id, token))
            elif job_id in node.hosted and node.hosted[job_id]["phase"] == "queued":
                node.hosted.pop(job_id)  # denied: dropped
            self._schedule(node)
        elif request.body.get("kind") == "finished":
            node.hosted.pop(job_id, None)  # the outbox emptied once the owner acknowledged

    @rule(data=st.data())
    @precondition(lambda self: bool(self.spawns))
    def launcher_starts(self, data: st.DataObject) -> None:
        site, job_id, token = self.spawns.pop(data.draw(st.integers(0, len(self.spawns) - 1)))
        node = self.nodes[site]
        if token in node.records:
            return  # voided by a restarted broker: refused, the job never starts
        node.records[token] = "started"
        node.processes[job_id] = token
        self.runs[job_id] += 1
        if node.up and node.hosted.get(job_id, {}).get("token") == token:
            self._send("report", site, OWNER, id=job_id, kind="started")

    @rule(data=st.data())
    @precondition(lambda self: any(n.processes for n in self.nodes.values()))
    def a_job_ends(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n in self.nodes.values() if n.processes]))
        job_id = data.draw(st.sampled_from(sorted(node.processes)))
        del node.processes[job_id]
        if node.up and job_id in node.hosted and node.hosted[job_id]["phase"] == "launching":
            self._exited(node, job_id)
        else:
            node.ended.add(job_id)  # its exit file waits for a broker

    def _exited(self, node: Node, job_id: str) -> None:
        assert node.agent is not None
        node.agent.finished(job_id)
        node.hosted[job_id]["phase"] = "finished"  # the outbox
        self._send("report", node.name, OWNER, id=job_id, kind="finished")
        self._schedule(node)

    # -- messages ----------------------------------------------------------------------------

    def _send(self, message_kind: str, src: str, dst: str, **body: Any) -> None:
        self.messages.append(Message(message_kind, src, dst, body, self.nodes[src].gen))

    def _answer(self, request: Message, **answer: Any) -> None:
        body = {"request": request, **answer}
        self.messages.append(Message("answer", request.dst, request.src, body, request.gen))

    def _deliverable(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if self.nodes[m.dst].up]

    @rule(data=st.data())
    @precondition(lambda self: bool(self._deliverable()))
    def deliver(self, data: st.DataObject) -> None:
        message = self.messages.pop(data.draw(st.sampled_from(self._deliverable())))
        self._deliver(message)

    def _deliver(self, message: Message) -> None:
        node = self.nodes[message.dst]
        if message.kind == "answer":
            request: Message = message.body["request"]
            if message.gen != node.gen:
                return  # the caller crashed meanwhile: nobody waits for this answer
            if request.kind == "withdraw":
                self._owner_hears_withdrawal(
                    request.body["id"], request.dst, message.body["withdrawn"]
                )
            else:
                self._site_hears(node, request, message.body)
            return
        if message.kind in ("claim", "report"):
            self._owner_handles(message)
        else:
            self._site_handles(node, message)

    @rule(data=st.data(), arrived=st.booleans())
    @precondition(lambda self: any(m.kind == "accept" and m.dst != OWNER for m in self.messages))
    def a_dispatch_fails(self, data: st.DataObject, arrived: bool) -> None:
        """The owner's accept call to b fails: b is suspected (its jobs move once their leases
        have run out). The accept may have arrived all the same; if not, it is sent again until
        it does, since b may be back before the lease is out and must then know of the job."""
        accepts = [m for m in self.messages if m.kind == "accept" and m.dst != OWNER]
        message = data.draw(st.sampled_from(accepts))
        if arrived and self.nodes[message.dst].up:
            self.messages.remove(message)
            self._site_handles(self.nodes[message.dst], message)
        if self.owner.up:
            self._carry_out(self._to_broker(SiteLost(message.dst)))

    @rule(data=st.data(), arrived=st.booleans())
    @precondition(
        lambda self: (
            self.owner.up and any(m.kind == "withdraw" and m.dst != OWNER for m in self.messages)
        )
    )
    def a_withdrawal_fails(self, data: st.DataObject, arrived: bool) -> None:
        """The owner's withdraw call to b fails (b is suspected), having arrived or not: the
        owner cannot know whether b removed the job, so it asks again (the request stays)."""
        withdrawals = [m for m in self.messages if m.kind == "withdraw" and m.dst != OWNER]
        message = data.draw(st.sampled_from(withdrawals))
        if arrived and self.nodes[message.dst].up:
            self._site_handles(self.nodes[message.dst], message)
            self.messages = [  # its answer, lost
                m
                for m in self.messages
                if not (m.kind == "answer" and m.body["request"] is message)
            ]
        self._carry_out(self._to_broker(SiteLost(message.dst)))

    # -- crashes and recovery ----------------------------------------------------------------

    @rule(name=st.sampled_from(SITES))
    def crash(self, name: str) -> None:
        """SIGKILL: what was in memory is gone; journals, launcher and processes stay."""
        node = self.nodes[name]
        if not node.up:
            return
        node.up, node.gen = False, node.gen + 1
        node.broker = node.agent = None
        # Its calls in progress die with it (their answers find nobody); requests it had
        # sent to others may still arrive, but its calls to itself were function calls.
        self.messages = [m for m in self.messages if not (m.src == m.dst == name)]

    @rule(name=st.sampled_from(SITES))
    def restart(self, name: str) -> None:
        node = self.nodes[name]
        if not node.up:
            node.up = True
            self._boot(node)

    def _boot(self, node: Node) -> None:
        """What :func:`gbroker.daemon.recovery.recover` does, in its order."""
        node.agent = SiteAgent(node.name, CORES, claim_every_start=True)
        if node.name == OWNER:
            node.broker = Broker(OWNER, ["b"], self.policy, no_transfer, lease=LEASE)
            for job_id, record in self.owned.items():
                if record["state"] != "active":
                    continue
                job, placed = self.jobs[job_id], record["placements"]
                if not placed:
                    self._carry_out(self._to_broker(JobSubmitted(job)))
                    continue
                granted = record["granted"]
                node.broker.restore(job, 0.0, dict(placed), granted, self.now)
                for site in placed:
                    if granted in (None, site):
                        replica = len(placed) > 1
                        self._send("accept", OWNER, site, id=job_id, replica=replica)
        agent = node.agent
        for job_id, hosted in sorted(
            node.hosted.items(), key=lambda item: item[1]["phase"] != "launching"
        ):
            job = self.jobs[job_id]
            if hosted["phase"] == "launching":
                token = hosted["token"]
                if token not in node.records:  # it never began, and now never will
                    node.records[token] = "void"
                    hosted["phase"] = "queued"
                elif job_id in node.processes:  # adopted
                    agent.resume_running(job, OWNER, job.rank, 0.0)
                    continue
                else:  # it ended meanwhile: report it
                    node.ended.discard(job_id)
                    hosted["phase"] = "finished"
            if hosted["phase"] == "queued":
                agent.accept(job, OWNER, hosted["replica"], lease_until=self.now)
            elif hosted["phase"] == "finished":
                self._send("report", node.name, OWNER, id=job_id, kind="finished")
        self._schedule(node)

    # -- what must hold ----------------------------------------------------------------------

    @invariant()
    def no_job_runs_twice(self) -> None:
        twice = {job_id: n for job_id, n in self.runs.items() if n > 1}
        assert not twice, twice

    def teardown(self) -> None:
        """Everyone back, every message delivered, every job ended: each ran exactly once."""
        if not self.jobs:
            return
        for node in self.nodes.values():
            if not node.up:
                node.up = True
                self._boot(node)
        self._to_broker(SiteBack("b"))
        for _ in range(10_000):
            if self.messages:
                self._deliver(self.messages.pop(0))
            elif self.spawns:
                self.launcher_starts_first()
            elif any(n.processes for n in self.nodes.values()):
                node = next(n for n in self.nodes.values() if n.processes)
                job_id = next(iter(node.processes))
                del node.processes[job_id]
                self._exited(node, job_id)
            else:
                break
        self.no_job_runs_twice()
        states = {job_id: record["state"] for job_id, record in self.owned.items()}
        assert set(states.values()) <= {"done", "failed"}, (states, self.messages)
        for job_id, state in states.items():
            assert self.runs[job_id] == (1 if state == "done" else 0), (job_id, state)

    def launcher_starts_first(self) -> None:
        site, job_id, token = self.spawns.pop(0)
        node = self.nodes[site]
        if token in node.records:
            return
        node.records[token] = "started"
        node.processes[job_id] = token
        self.runs[job_id] += 1
        if node.hosted.get(job_id, {}).get("token") == token:
            self._send("report", site, OWNER, id=job_id, kind="started")


def _machine(algorithm: Algorithm, **kw: Any) -> type[Protocol]:
    return type(f"Protocol_{algorithm}", (Protocol,), {"policy": DispatchPolicy(algorithm, **kw)})


MACHINES = {
    "dlo": _machine(Algorithm.DLO),
    "dr": _machine(Algorithm.DR, replicas=2),
    "dm": _machine(Algorithm.DM, interval=1.0, epsilon=0.0),
    "drm": _machine(Algorithm.DRM, replicas=2, interval=1.0, epsilon=0.0),
}


@pytest.mark.parametrize("algorithm", sorted(MACHINES))
@pytest.mark.slow
def test_no_interleaving_of_crashes_and_messages_runs_a_job_twice_or_loses_one(
    algorithm: str,
) -> None:
    machine = MACHINES[algorithm]
    machine.TestCase.settings = settings(
        # Fewer under mutation testing (scripts/quality/mutation.sh), where it runs once per mutant.
        max_examples=int(os.environ.get("GBROKER_MODEL_EXAMPLES", "300")),
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
