"""Clients of a broker network: find the fleet, submit to any broker, follow jobs.

:mod:`.quick` is the command line's small synchronous client (a process start matters there),
:mod:`.gclient` the asyncio client for programs (GClient, ARCHITECTURE §3), :mod:`.fleetdir`
where a user's fleet is, so that no command needs a URL or a token typed. This ``__init__``
imports nothing, so that the command line's fast path pays only for what it uses.

May import: :mod:`gbroker.jobs`, :mod:`gbroker.protocol`, :mod:`gbroker.security`,
:mod:`gbroker.errors`; never the daemon.
"""
