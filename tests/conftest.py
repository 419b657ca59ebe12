"""Shared test helpers: where the externally written test data lives, a test run of its own for
every broker and fleet, and the real MQTT brokers of :mod:`tests.brokers` (fixtures of every test
directory)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokers import bounded, fleet_mqtt, mqtt_broker, secured_broker

__all__ = ["bounded", "fleet_mqtt", "mqtt_broker", "secured_broker", "shared_data"]

ROOT = Path(__file__).resolve().parent.parent


def shared_data() -> Path:
    """../shared/data beside the checkout, or $GBROKER_SHARED_DATA."""
    return Path(os.environ.get("GBROKER_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(autouse=True, scope="session")
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Brokers started by tests (and fixtures of any scope) record their token files in a
    directory of the test run, not the user's; fleets they bring up become the default fleet of
    the test run, not the user's; caches are the test run's; and no token, broker or fleet leaks
    in from the environment."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GBROKER_RUNTIME_DIR", str(tmp_path_factory.getbasetemp() / "runtime"))
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "state"))
        # Caches too (the built JSDL schemas, gbroker.jobs.jsdl_schema): the test run's own.
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
        for name in ("GBROKER_TOKEN", "GBROKER_TOKEN_FILE", "GBROKER_URL", "GBROKER_FLEET"):
            patch.delenv(name, raising=False)
        yield


def pytest_configure(config: pytest.Config) -> None:
    """Commands the tests start take Ctrl-C and a closed terminal as a user's would: a run
    started in the background (``cmd &`` ignores SIGINT) or under ``nohup`` (SIGHUP) passes
    the ignored dispositions on to every child, and the tests of what SIGINT and SIGHUP do
    then fail for their runner's reasons, not the code's."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first (their files, with pytest-xdist's --dist loadfile): started
    last, a file of them would run on alone while the other workers stand idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
