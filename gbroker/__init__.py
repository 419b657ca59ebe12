"""GBroker: decentralized scheduling of parallel jobs across many clusters.

The packages, from the ground up (each may import only those below it; ``docs/DESIGN.md`` draws
the map and says where a change belongs):

- :mod:`gbroker.errors`: the exceptions, split by whose fault a failure is.
- :mod:`gbroker.untrusted`: loaders for documents nobody vouches for (YAML without aliases).
- :mod:`gbroker.core`: pure decisions (F(j), dispatch, the local scheduler, malleability).
- :mod:`gbroker.app`: what a job imports (the malleable resize protocol's application end).
- :mod:`gbroker.jobs`: job descriptions (JSDL, JSON/YAML, parameter sweeps).
- :mod:`gbroker.topology`: sites, links, neighbourhoods, their files.
- :mod:`gbroker.security`: client tokens, peer signatures, TLS.
- :mod:`gbroker.protocol`: what crosses the wire (peer messages, the idempotency key).
- :mod:`gbroker.mqtt`: the status and liveness transport.
- :mod:`gbroker.site`: how a site runs jobs (launchers, the executor, resizes).
- :mod:`gbroker.workloads`, :mod:`gbroker.sim`: workloads and the discrete-event simulator.
- :mod:`gbroker.daemon`: the broker daemon.
- :mod:`gbroker.client`: clients of a broker network.
- :mod:`gbroker.fleet`: fleets of brokers as processes, namespaces or containers.
- :mod:`gbroker.tools`: ``demo`` and ``chaos``.
- :mod:`gbroker.cli`: the ``gbroker`` command.

Beside it, :mod:`netmon` and :mod:`dcsmon` are the monitors (pure forecasters and views, and
their agents).
"""

__version__ = "0.1.0"
