"""GBroker: decentralized scheduling of parallel jobs across many clusters."""

__version__ = "0.1.0"
