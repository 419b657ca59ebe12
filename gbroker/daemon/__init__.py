"""The broker daemon: asyncio drivers of the core."""
