"""A running job's limits across its moves: what it used before, what remains. Pure.

Theory of operation. A job's wall-time and CPU-time limits (POSIX ``WallTimeLimit``,
``CPUTimeLimit``) are the job's, not each site's. A running job moved by checkpoint
(:mod:`gbroker.daemon.moving`) would otherwise get them whole again at each site it is restored
at: its wall-time timer starts at the restore, and its processes' CPU time (which RLIMIT_CPU
counts) starts from nothing, as CRIU cannot restore a process's CPU time and a job started again
from its own saved state is a new process.

So what a job used travels with it. The source, once the job is frozen for its move, knows how
long it ran there (wall seconds from its start, or restore, there to its freeze: the time it is
frozen for a move does not count) and the CPU seconds its processes used there; it adds them to
what the job had used before it came (:meth:`Used.then`). That total (:class:`Used`) goes to the
owner with the source's word that the job is frozen, to the target with the owner's ``accept``,
and into the target's journal, so that a restarted target applies it too. The target gives the
job only what remains: its timer :func:`wall_left`, its RLIMIT_CPU :func:`cpu_left`. Nothing left
ends the job at once, for that limit's reason; :func:`in_all` says what it used, for people.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gbroker.errors import InvalidInput

__all__ = ["MAX_SECONDS", "NOTHING", "Used", "cpu_left", "in_all", "wall_left"]

MAX_SECONDS: Final = float(2**40)
"""The most seconds (of wall or CPU time) a job may be said to have used: a bound on what a
peer may send, far beyond any job's limit."""
MAX_MOVES: Final = 2**31 - 1


def _seconds(field: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_SECONDS
    ):
        raise InvalidInput(field, f"seconds in [0, {MAX_SECONDS:g}]", value)
    return float(value)


@dataclass(frozen=True, slots=True)
class Used:
    """What a job used at the sites it ran at before its present one.

    Attributes:
        wall: seconds it ran there (from each start or restore to the freeze of its move).
        cpu: CPU seconds its processes used there.
        moves: how many times it moved (the sites it ran at before its present one).
    """

    wall: float = 0.0
    cpu: float = 0.0
    moves: int = 0

    def __post_init__(self) -> None:
        _seconds("used.wall", self.wall)
        _seconds("used.cpu", self.cpu)
        if (
            isinstance(self.moves, bool)
            or not isinstance(self.moves, int)
            or not 0 <= self.moves <= MAX_MOVES
        ):
            raise InvalidInput("used.moves", f"an integer in [0, {MAX_MOVES}]", self.moves)

    def then(self, wall: float, cpu: float) -> Used:
        """This and one site's more: the job ran ``wall`` seconds there, using ``cpu`` CPU
        seconds, and now moves on."""
        return Used(
            self.wall + _seconds("ran.wall", wall),
            self.cpu + _seconds("ran.cpu", cpu),
            self.moves + 1,
        )

    def as_mapping(self) -> dict[str, float | int]:
        """The map a peer message and the journal carry (:meth:`from_mapping` reads it)."""
        return {"wall": self.wall, "cpu": self.cpu, "moves": self.moves}

    @classmethod
    def from_mapping(cls, value: object, field: str = "used") -> Used:
        """:meth:`as_mapping`'s map, checked: :class:`InvalidInput` naming ``field`` else."""
        if not isinstance(value, Mapping) or set(value) != {"wall", "cpu", "moves"}:
            raise InvalidInput(field, "a map of wall, cpu (seconds) and moves", value)
        try:
            return cls(value["wall"], value["cpu"], value["moves"])
        except InvalidInput as exc:
            raise InvalidInput(
                f"{field}.{exc.field.removeprefix('used.')}", exc.expected, exc.found
            ) from None


NOTHING: Final = Used()
"""What a job that never moved used elsewhere."""


def wall_left(limit: float | None, used: Used) -> float | None:
    """Seconds the job may still run under its wall-time ``limit``, having used ``used``: 0 once
    it is used up; None without a limit."""
    if limit is None:
        return None
    return max(0.0, limit - used.wall)


def cpu_left(limit: int | None, used: Used) -> int | None:
    """The RLIMIT_CPU of the job's processes under its CPU-time ``limit``, having used ``used``:
    whole seconds (as RLIMIT_CPU counts them), rounded up, so that the job never gets less than
    it has left; 0 once it is used up; None without a limit."""
    if limit is None:
        return None
    return max(0, math.ceil(limit - used.cpu))


def in_all(before: float, here: float, moves: int) -> str:
    """What a moved job used of a limit, for people: ``before`` seconds at the sites it ran at
    before (``moves`` of them) and ``here`` at its present one: ``20.1 s used, over 3 moves``."""
    return f"{before + here:.1f} s used, over {moves} move{'' if moves == 1 else 's'}"
