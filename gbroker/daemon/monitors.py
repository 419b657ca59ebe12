"""The monitors as processes of their own (``gbroker dcsmon serve``, ``gbroker netmon serve``).

A broker runs its DCSMon and NetMon agents in-process by default; a site may run either apart
instead (on another host, under another account). Each then publishes on its own MQTT link
(:class:`~gbroker.mqtt.link.MonitorLink`, kept up by :func:`~gbroker.mqtt.link.keep_publishing`)
as its site, and the site's broker learns what it publishes from MQTT like any neighbour's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import ClientSession

from dcsmon.service import DcsMon, HttpSampler
from gbroker.mqtt.link import keep_publishing
from netmon.forecast import Forecaster
from netmon.service import NetMonAgent

__all__ = ["serve_dcsmon", "serve_netmon"]


async def serve_dcsmon(
    site: str,
    broker_url: str,
    mqtt_url: str,
    *,
    period: float = 1.0,
    token: str | None = None,
    mqtt_username: str | None = None,
    mqtt_password: str | None = None,
) -> None:
    """Run a standalone DCSMon for ``site``: sample ``broker_url``, publish on ``mqtt_url``.

    Runs until cancelled; a lost MQTT link is rejoined. Raises InvalidInput if the broker at
    ``broker_url`` is not ``site``'s. With access control, the monitor connects as its site:
    ``mqtt_username`` is the site's name and ``mqtt_password`` the site's MQTT password.
    """
    async with ClientSession() as session:
        monitor = DcsMon(HttpSampler(session, broker_url, site, token=token), period)
        await keep_publishing(
            mqtt_url,
            site,
            "dcsmon",
            monitor.publish_states,
            username=mqtt_username,
            password=mqtt_password,
        )


async def serve_netmon(
    site: str,
    neighbours: Iterable[str],
    peers: Mapping[str, str],
    mqtt_url: str,
    forecaster: Forecaster,
    *,
    mqtt_username: str | None = None,
    mqtt_password: str | None = None,
    **agent_options: Any,
) -> None:
    """Run a standalone NetMon agent for ``site`` publishing on ``mqtt_url``, until cancelled.

    ``agent_options`` go to :class:`NetMonAgent` (sizes, period, headers...). A lost MQTT link
    is rejoined; probing goes on meanwhile, and the latest table is published on rejoining.
    With access control the agent connects as its site (``mqtt_username``, ``mqtt_password``).
    """
    agent = NetMonAgent(site, neighbours, peers, forecaster, **agent_options)
    async with ClientSession() as session, asyncio.TaskGroup() as tasks:
        tasks.create_task(agent.run(session), name="netmon-probe")
        tasks.create_task(
            keep_publishing(
                mqtt_url,
                site,
                "netmon",
                agent.publish_tables,
                username=mqtt_username,
                password=mqtt_password,
            ),
            name="netmon-publish",
        )
