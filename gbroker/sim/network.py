"""A flow-level network model: concurrent transfers share link bandwidth (max-min fairness).

Theory of operation. A transfer from site a to site b crosses a's uplink, b's downlink and, when
the topology names one, the pair link (a, b). Each of these *resources* has a capacity in bytes/s.
The active transfers get max-min fair rates, found by progressive filling: the resource with the
smallest fair share is the bottleneck of every unfrozen transfer through it. Those transfers are
frozen at that share and the rest of the network is refilled. Rates are recomputed whenever a
transfer starts or ends. The remaining bytes are advanced at the old rates first, so bytes are
exact between events. Only the earliest completion is on the kernel's agenda. A version number
voids stale completion entries instead of removing them from the heap.

A transfer of m bytes with link latency L therefore takes L + the time its bytes need at the
shares it gets. Copying one job's inputs to six sites at once loads the data site's uplink six
ways, which is the effect the GBroker paper observed for DR with m = 6.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gbroker.errors import InvalidInput
from gbroker.sim.kernel import Kernel

__all__ = ["FlowNetwork", "Transfer"]

Resource = tuple[str, ...]  # ("up", site), ("down", site) or ("link", a, b)
_EPS = 1e-9


@dataclass(slots=True, eq=False)
class Transfer:
    source: str
    target: str
    size: int
    on_done: Callable[[Transfer], None]
    resources: tuple[Resource, ...]
    latency: float
    started_at: float
    remaining: float = 0.0
    rate: float = 0.0
    finished_at: float | None = None
    tags: dict[str, object] = field(default_factory=dict)


class FlowNetwork:
    """Bandwidth sharing on a kernel. ``capacity(resource)`` gives bytes/s of a resource."""

    def __init__(
        self,
        kernel: Kernel,
        route: Callable[[str, str], tuple[tuple[Resource, ...], float]],
        capacity: Callable[[Resource], float],
    ) -> None:
        self.kernel = kernel
        self._route = route
        self._capacity = capacity
        self.active: list[Transfer] = []
        self._updated = kernel.now
        self._version = 0
        self.bytes_moved = 0

    def send(
        self, source: str, target: str, size: int, on_done: Callable[[Transfer], None]
    ) -> Transfer:
        """Start moving ``size`` bytes; ``on_done(transfer)`` runs when the last byte arrives."""
        if size < 0:
            raise InvalidInput("transfer.size", "bytes >= 0", size)
        resources, latency = self._route(source, target)
        now = self.kernel.now
        transfer = Transfer(source, target, size, on_done, resources, latency, now, float(size))
        if size == 0 or source == target:
            self.kernel.after(latency if source != target else 0.0, self._deliver, transfer)
            return transfer
        self._advance()
        self.active.append(transfer)
        self._reshare()
        return transfer

    def _advance(self) -> None:
        now = self.kernel.now
        elapsed = now - self._updated
        if elapsed > 0:
            for t in self.active:
                t.remaining -= t.rate * elapsed
        self._updated = now

    def _reshare(self) -> None:
        """Max-min fair rates by progressive filling, then arm the earliest completion."""
        unfrozen = list(self.active)
        left: dict[Resource, float] = {}
        users: dict[Resource, int] = {}
        for t in unfrozen:
            for r in t.resources:
                if r not in left:
                    left[r] = self._capacity(r)
                users[r] = users.get(r, 0) + 1
        while unfrozen:
            bottleneck = min(users, key=lambda r: left[r] / users[r])
            share = left[bottleneck] / users[bottleneck]
            frozen = [t for t in unfrozen if bottleneck in t.resources]
            unfrozen = [t for t in unfrozen if bottleneck not in t.resources]
            for t in frozen:
                t.rate = share
                for r in t.resources:
                    left[r] -= share
                    users[r] -= 1
                    if users[r] == 0:
                        del users[r]
        self._version += 1
        if self.active:
            soonest = min(max(t.remaining, 0.0) / t.rate for t in self.active)
            self.kernel.after(soonest, self._complete, self._version)

    def _complete(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later reshare
        self._advance()
        # Whatever is due now (to a nanosecond at its rate) is done; rounding may leave the
        # transfer that armed this entry a hair short, and it must not re-arm itself forever.
        done = [t for t in self.active if t.remaining <= t.rate * _EPS]
        if not done:
            done = [min(self.active, key=lambda t: t.remaining / t.rate)]
        self.active = [t for t in self.active if t not in done]
        self._reshare()
        for t in done:
            self.kernel.after(t.latency, self._deliver, t)

    def _deliver(self, transfer: Transfer) -> None:
        transfer.finished_at = self.kernel.now
        self.bytes_moved += transfer.size
        transfer.on_done(transfer)
