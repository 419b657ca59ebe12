"""Named background tasks that a daemon owns and cancels together.

A daemon starts many short tasks (a dispatch, a report, a staging) and a few long ones (the MQTT
link, NetMon). :class:`Tasks` keeps a strong reference to each until it ends (the event loop keeps
only weak ones), logs a task that failed once, with its name, and cancels whatever is left when
the daemon stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

__all__ = ["Tasks"]

log = logging.getLogger("gbroker.daemon")


class Tasks:
    """The background tasks of one daemon (``site`` names it in log lines)."""

    def __init__(self, site: str) -> None:
        self.site = site
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed", self.site, task.get_name(), exc_info=task.exception())

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
