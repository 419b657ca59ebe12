"""``gbroker explain``: how the owner ranks each candidate site for a job, as JSON.

Theory of operation. The decision itself is the core's (:meth:`Broker.explain
<gbroker.core.dispatch.Broker.explain>`: every site of L(i) ∪ {i} with F(j) term by term, or
the reason it is not in S(i)); this module only puts it into the JSON the client API answers
with, beside what the job asks for. It explains the ranking *now*, on the broker's current
view: a job that was dispatched a while ago may have been ranked on other states.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gbroker.core.dispatch import Verdict
from gbroker.core.model import Job
from gbroker.errors import InvalidInput
from gbroker.jobs.description import JobDescription
from gbroker.jobs.documents import summary

if TYPE_CHECKING:
    from gbroker.daemon.driver import Driver

__all__ = ["explained", "verdict_document"]


def verdict_document(verdict: Verdict) -> dict[str, Any]:
    """One candidate: its F(j) and terms, or why it is left out."""
    out: dict[str, Any] = {"site": verdict.site, "feasible": verdict.feasible}
    if verdict.terms is not None:
        t = verdict.terms
        out |= {
            "best": verdict.best,
            "F": t.value,
            "transfer_time": t.transfer_time,
            "transfer": t.transfer,
            "free": t.free,
            "load": t.load,
            "waits": t.waits,
            "penalty": verdict.penalty,
        }
        if verdict.hosts:  # the job's candidate hosts hold it to these hosts of the site
            out["hosts"] = list(verdict.hosts)
    else:
        out["reason"] = verdict.reason
        if verdict.unmet is not None:
            out |= {
                "need": str(verdict.unmet.need),
                "wanted": verdict.unmet.wanted,
                "has": verdict.unmet.has,
            }
    return out


def explained(driver: Driver, job: Job, desc: JobDescription) -> dict[str, Any]:
    """The owner's ranking of ``job``'s candidate sites now, with what the job asks for."""
    verdicts = driver.broker.explain(job, driver.decision_view, time.time())
    out: dict[str, Any] = {
        "job": job.id,
        "owner": driver.site,
        "algorithm": str(driver.broker.policy.algorithm),
        "rank": job.rank,
        "asks": [line for line in summary(desc) if line.startswith(("cores", "needs", "stage in"))],
        "candidates": [verdict_document(v) for v in verdicts],
    }
    if desc.model is not None:  # placed by the AppLeS planner: what it saw, every set it weighed
        broker, view = driver.broker, driver.decision_view
        resources = broker.model_resources(job, view, driver.speeds)
        out["resources"] = [
            {"site": r.site, "cores": r.cores, "cpu": r.cpu, "speed": r.speed} for r in resources
        ]
        try:
            plan = broker.plan_model(job, desc.model, view, driver.speeds, resources=resources)
        except InvalidInput as exc:
            out["plan_error"] = str(exc)
        else:
            out["plan"] = plan.as_dict()
    return out
