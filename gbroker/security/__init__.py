"""Who may speak: client tokens, peer signatures, TLS certificates, token files.

:mod:`.auth` maps client tokens to users and signs and verifies peer messages, :mod:`.tls` makes
a fleet's CA and site certificates and the SSL contexts of servers and clients, :mod:`.runtime`
records where a user's brokers keep their tokens. Used by the daemon, the fleets and the clients.

May import: :mod:`gbroker.errors` and libraries; nothing above.
"""
