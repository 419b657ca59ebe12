"""Programs for people built on fleets and clients: ``gbroker demo``, ``gbroker chaos`` (the
resilience test that kills brokers), and progress bars for long commands.

May import: :mod:`gbroker.fleet`, :mod:`gbroker.client`, :mod:`gbroker.topology` and below;
never the daemon.
"""
