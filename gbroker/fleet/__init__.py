"""Fleets: one broker per site, plus an MQTT broker (§9), as processes, in network namespaces
or in containers.

Theory of operation. ``up`` gives every site of a topology an endpoint and writes the topology with
those endpoints into the fleet directory, so that every broker knows its peers' URLs: a free
loopback port (``runtime="local"``), its namespace's address and port 8700 (``"netns"``,
:mod:`gbroker.fleet.netns`: its access link shaped as the topology says), or its container's name
and port 8700 (``"docker"``, :mod:`gbroker.fleet.containers`: the host reaches it on a port
published on 127.0.0.1). What follows holds for every runtime; the runtime modules say what differs.
It starts an MQTT broker process, the embedded amqtt one (``gbroker mqtt-serve``) or a mosquitto,
unless an external one is named, then one ``gbroker serve`` process per site. A site with
``manager: slurm`` or ``manager: gridengine`` (a local fleet only) first gets a batch system of
its own (:mod:`gbroker.fleet.batch`): a Slurm cluster in ``<dir>/slurm/<site>``
(:mod:`gbroker.fleet.slurm`), its broker ``--manager slurm --slurm-conf`` that cluster's
``slurm.conf``; a Grid Engine cell (:mod:`gbroker.fleet.gridengine`), its broker ``--manager
gridengine`` with the cell's ``SGE_ROOT``, ``SGE_CELL`` and ports in its environment (recorded
with the member: a restart gives the same); ``down`` stops the system after the broker, and a
broker's ``kill`` or ``restart`` leaves it running (its jobs live on in it).

The MQTT broker the fleet runs refuses anonymous clients and confines each site to its own
topics (:mod:`gbroker.mqtt.link`, "Access control"): ``up`` writes the fleet directory's
``mqtt/`` (0700) with one password file per site (``mqtt/<site>.password``, 0600), the hashed
passwords and the ACL for the MQTT broker, and gives each ``serve`` its password file
(``--mqtt-password-file``; the user is the site). A standalone monitor of a site is given the
same file. An external MQTT broker (``--mqtt URL``) is the operator's to secure; the fleet then
passes no credentials. All of them are detached into their own
sessions, with their logs in the fleet directory. It waits until every broker answers HTTP, and
records the pids and URLs in ``fleet.json``. The other commands read that file:
- ``status`` probes each process and each broker's HTTP API;
- ``kill`` sends SIGKILL to one site (its MQTT last-will then tells the neighbours);
- ``restart`` starts it again with the same arguments and the same data directory, so it
  resumes from its journal;
- ``kill_mqtt`` and ``restart_mqtt`` do the same to the MQTT broker the fleet runs, and
  ``set_serve_option`` restarts every broker with one option of ``serve`` changed (what
  ``gbroker chaos`` uses, :mod:`gbroker.tools.chaos`);
- ``down`` sends SIGTERM to everything and then SIGKILL to stragglers;
- ``drain`` asks one site to take no new work, hand its queued jobs back to their owners and let
  its running jobs finish, and waits (with progress) until it says it is drained; ``undrain``
  lifts that (:mod:`gbroker.daemon.drain`). Both also work against any broker's URL with an
  admin token, without a fleet directory.

With ``tls``, ``up`` makes the fleet CA and a certificate per site (and for the embedded MQTT
broker) in ``<dir>/tls`` (:mod:`gbroker.security.tls`; an existing CA is kept), writes ``https://``
endpoints into the topology and starts every member with its certificate, its key and the CA;
the embedded MQTT broker then speaks ``mqtts://``. Clients verify with ``<dir>/tls/ca.crt``.

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
