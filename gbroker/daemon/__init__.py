"""The broker daemon: the asyncio driver of the core, one per site.

:mod:`.server` composes the rest; :mod:`.driver` feeds the core and carries out its commands (the
mirror of :mod:`gbroker.sim.grid`); :mod:`.client_api`, :mod:`.arrays`, :mod:`.submissions` and
:mod:`.explain` serve clients; :mod:`.peers` and :mod:`.heartbeat` talk to other brokers;
:mod:`.guard` authenticates every request; :mod:`.journal`, :mod:`.history` and
:mod:`.recovery` keep jobs across crashes; :mod:`.files`, :mod:`.staging` and :mod:`.urls` move
files; :mod:`.metrics` and :mod:`.dashboard` show it all; :mod:`.drain` takes a site out of
service; :mod:`.monitors` runs DCSMon or NetMon as a process of its own.

May import: :mod:`gbroker.core`, :mod:`gbroker.jobs`, :mod:`gbroker.topology`,
:mod:`gbroker.protocol`, :mod:`gbroker.mqtt`, :mod:`gbroker.security`, :mod:`gbroker.site`,
:mod:`netmon`, :mod:`dcsmon`, :mod:`gbroker.errors`; never the clients, fleets or command line.
"""
