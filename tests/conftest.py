"""Shared test helpers: where the externally written test data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def shared_data() -> Path:
    """../shared/data beside the checkout, or $GBROKER_SHARED_DATA."""
    return Path(os.environ.get("GBROKER_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers started by tests record their token files in a directory of the test run, not
    the user's, and no token leaks in from the environment."""
    monkeypatch.setenv("GBROKER_RUNTIME_DIR", str(tmp_path_factory.getbasetemp() / "runtime"))
    monkeypatch.delenv("GBROKER_TOKEN", raising=False)
    monkeypatch.delenv("GBROKER_TOKEN_FILE", raising=False)
