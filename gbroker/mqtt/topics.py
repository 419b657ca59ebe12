"""MQTT topics: what each site publishes where (ARCHITECTURE §5).

Theory of operation. Every site owns four topics under ``gbroker/v1/site/<site>/``:

- ``state``: its latest DCSMon report (a ``site-state`` message, :mod:`gbroker.protocol.wire`),
  retained, so a broker that (re)subscribes learns each neighbour's state at once instead of
  waiting for the next publication;
- ``alive``: the plain string ``online``, retained, published on connecting; the connection's
  MQTT **last-will** is a retained ``offline`` on the same topic, so when a broker dies (SIGKILL,
  crash, or a silent link that misses its keep-alive) the MQTT broker itself tells the neighbours.
  A clean close does not fire the will, so :class:`SiteLink` publishes ``offline`` itself;
- ``netmon``: its NetMon forecast table (a ``netmon-table`` message), retained;
- ``events``: its job events.
"""

from __future__ import annotations

from typing import Final

from gbroker.errors import InvalidInput

# --- topics ------------------------------------------------------------------------------------


def check_site(site: str) -> str:
    """``site`` if it can be one level of a topic: no ``/``, wildcards or NUL; not ``$``-led."""
    if (
        not isinstance(site, str)
        or not site
        or any(c in site for c in "/+#\0")
        or site.startswith("$")
    ):
        raise InvalidInput(
            "site", "a non-empty name without '/', '+', '#', NUL or a leading '$'", site
        )
    return site


def state_topic(site: str) -> str:
    """Where ``site``'s DCSMon state is published (retained)."""
    return f"{TOPIC_ROOT}/{check_site(site)}/state"


def alive_topic(site: str) -> str:
    """Where ``site``'s liveness is published: retained ``online``; last-will ``offline``."""
    return f"{TOPIC_ROOT}/{check_site(site)}/alive"


def netmon_topic(site: str) -> str:
    """Where ``site``'s NetMon forecast table is published."""
    return f"{TOPIC_ROOT}/{check_site(site)}/netmon"


def events_topic(site: str) -> str:
    """Where ``site``'s job events are published."""
    return f"{TOPIC_ROOT}/{check_site(site)}/events"


def parse_site_topic(topic: str) -> tuple[str, str] | None:
    """``(site, channel)`` of a site topic, e.g. ``("s1", "state")``; None for any other topic."""
    prefix = TOPIC_ROOT + "/"
    if not topic.startswith(prefix):
        return None
    site, _, channel = topic[len(prefix) :].partition("/")
    if not site or channel not in _CHANNELS:
        return None
    return site, channel


TOPIC_ROOT: Final = "gbroker/v1/site"
"""Every site's topics live under ``TOPIC_ROOT/<site>/``."""


_CHANNELS: Final = frozenset({"state", "alive", "netmon", "events"})


def short_name(name: str) -> str:
    return name if len(name) <= 40 else name[:40] + "..."
