#!/usr/bin/env bash
# Create .venv with gbroker and its development tools. Idempotent; safe on a fresh machine.
# Usage: bash scripts/setup/setup.sh [EXTRAS]   (default extras: dev)
set -euo pipefail
cd "$(dirname "$0")/../.."
extras="${1:-dev}"
# The CLI's sweeps (gbroker sim --seeds, the figure and experiment scripts) run on Dask: its
# extra goes with any others.
case ",$extras," in *,sweep,*) ;; *) extras="$extras,sweep" ;; esac
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
stamp=".venv/.gbroker-installed-$extras"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # A "compat" editable install puts the checkout on sys.path with a plain .pth line; the
    # default one installs an import hook whose own imports (pathlib, importlib.util) cost every
    # `gbroker` process about 10 ms at start (scripts/bench/bench_cli.py times the CLI).
    .venv/bin/python -m pip install --quiet -e ".[$extras]" --config-settings editable_mode=compat
    touch "$stamp"
fi
# Byte-code for GBroker's own modules: an editable install leaves them to be compiled at each
# import, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) nothing ever writes it,
# so every broker, launcher and command would compile them again (0.5 s of each broker's start).
# A stale file is harmless: Python checks each against its source.
.venv/bin/python -m compileall -q -j 0 gbroker netmon dcsmon
# The native front of `gbroker` (a plain `gbroker submit` without a Python start): best effort.
bash scripts/setup/build_native.sh
