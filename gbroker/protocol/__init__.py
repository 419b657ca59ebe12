"""What crosses the wire between brokers, monitors and clients: message formats and their checks.

:mod:`.wire` is the MessagePack messages of the peer API and of MQTT payloads (versioned,
validated where they enter), :mod:`.idempotency` the ``Idempotency-Key`` header that makes a
submission exactly once. Pure: no sockets, no clocks.

May import: :mod:`gbroker.core`, :mod:`gbroker.jobs`, :mod:`netmon` (its tables),
:mod:`gbroker.errors`.
"""
