"""MQTT, the status and liveness transport (ARCHITECTURE §5): topics, links, the embedded
broker, its accounts and topic ACL.

:mod:`.link` holds the topics and the connections (a broker's :class:`~.link.SiteLink`, a
standalone monitor's :class:`~.link.MonitorLink`), :mod:`.broker` the in-process amqtt broker
and the ACL it enforces, :mod:`.accounts` the per-site passwords and the files a fleet gives its
MQTT broker (amqtt or mosquitto).

May import: :mod:`gbroker.protocol`, :mod:`gbroker.core`, the pure parts of :mod:`netmon` and
:mod:`dcsmon`, :mod:`gbroker.security`, :mod:`gbroker.errors`.
"""
