"""Shared test helpers: where the externally written test data lives."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shared_data() -> Path:
    """../shared/data beside the checkout, or $GBROKER_SHARED_DATA."""
    return Path(os.environ.get("GBROKER_SHARED_DATA", ROOT.parent / "shared" / "data"))
