"""Fleets: one broker per site, plus an MQTT broker (§9), as processes, in network namespaces
or in containers.

Theory of operation. ``up`` gives every site of a topology an endpoint and writes the topology with
those endpoints into the fleet directory, so that every broker knows its peers' URLs: a free
loopback port (``runtime="local"``), its namespace's address and port 8700 (``"netns"``,
:mod:`gbroker.fleet.netns`: its access link shaped as the topology says), or its container's name
and port 8700 (``"docker"``, :mod:`gbroker.fleet.containers`). What follows holds for every
runtime; the runtime modules say what differs. It starts an MQTT broker (the embedded amqtt one
or a mosquitto, refusing anonymous clients and confining each site to its own topics, one
password file per site) unless an external one is named, then one ``gbroker serve`` process per
site, each detached into its own session with its log in the fleet directory. A site with
``manager: slurm`` or ``manager: gridengine`` (a local fleet only) first gets a batch system of
its own (:mod:`gbroker.fleet.batch`), which outlives its broker's ``kill`` and ``restart``.

``up`` waits until every broker answers HTTP and records the pids and URLs in ``fleet.json``;
the other commands (``status``, ``kill``, ``restart``, ``down``, ``drain``, the MQTT broker's
own kill and restart, :mod:`gbroker.tools.chaos`'s option changes) read that file. A restarted
broker keeps its arguments and data directory, so it resumes from its journal. With ``tls``,
``up`` makes the fleet CA and a certificate per site (:mod:`gbroker.security.tls`) and every
endpoint is ``https://``. Each runtime step by step: docs/DEPLOY.md; the MQTT accounts and TLS:
docs/SECURITY.md.

May import: :mod:`gbroker.topology`, :mod:`gbroker.mqtt`, :mod:`gbroker.security`,
:mod:`gbroker.client`, :mod:`gbroker.errors` and libraries; never the daemon (it starts brokers as
processes).
"""

from gbroker.fleet.containers import compose
from gbroker.fleet.control import (
    kill,
    kill_mqtt,
    partition,
    restart,
    restart_mqtt,
    set_serve_option,
    shape,
    status,
)
from gbroker.fleet.draining import DrainTarget, JobsWatch, drain, drain_left, drain_target
from gbroker.fleet.launch import up
from gbroker.fleet.members import (
    FLEET_FILE,
    MQTT_BROKERS,
    RUNTIMES,
    FleetError,
    client_token,
    load,
    site_alive,
)
from gbroker.fleet.teardown import Down, down

__all__ = [
    "FLEET_FILE",
    "MQTT_BROKERS",
    "RUNTIMES",
    "Down",
    "DrainTarget",
    "FleetError",
    "JobsWatch",
    "client_token",
    "compose",
    "down",
    "drain",
    "drain_left",
    "drain_target",
    "kill",
    "kill_mqtt",
    "load",
    "partition",
    "restart",
    "restart_mqtt",
    "set_serve_option",
    "shape",
    "site_alive",
    "status",
    "up",
]
