#!/usr/bin/env python3
"""A job that counts: it prints 1 to ``--to`` (40), one number a line, pausing between them.

It moves between sites without CRIU (issue 27): its state is the next number to print, saved by
its ``on_checkpoint`` hook (:mod:`gbroker.app.malleable`) at its safe point, just before it
prints a number. A checkpointed job stops there; started again elsewhere with
``GBROKER_RESTORE``, it goes on from that number, so across the move every number is printed
once and in order. Without a control socket (``GBROKER_CONTROL``: run by hand) it just counts.

Standard library only, and gbroker.app.malleable, which every GBroker site puts on its jobs'
``PYTHONPATH``; run from a checkout, it finds the library there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType


def _library() -> ModuleType:
    """gbroker.app.malleable: from the site (on the job's path), else a copy beside this script,
    else from the checkout this script is in."""
    for name in ("gbroker.app.malleable", "malleable"):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    return importlib.import_module("gbroker.app.malleable")


malleable = _library()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=int, default=40, help="the last number (40)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between numbers (0.5)")
    args = parser.parse_args()
    state = malleable.restored()
    following = 1 if state is None else int(json.loads(state)["next"])
    if state is not None:
        print(f"restored: going on from {following}", file=sys.stderr, flush=True)
    if os.environ.get(malleable.CONTROL_ENV):
        # Called while the loop below waits in safe_point: ``following`` is not yet printed.
        malleable.serve(on_checkpoint=lambda: json.dumps({"next": following}).encode())
    while following <= args.to:
        malleable.safe_point()
        print(following, flush=True)
        following += 1
        time.sleep(args.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
