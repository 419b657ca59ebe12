#!/usr/bin/env bash
# Make sure the `python3` a site's jobs run (the first on the brokers' PATH) can import numpy:
# examples/jacobi2d.py, the AppLeS paper's Jacobi2D, runs as the components of a co-allocated job
# and its tests run it on fleets. Debian's own python3 gets python3-numpy (pip may not install
# into it, PEP 668); another python3 (pyenv's, a venv's) gets numpy from pip. Idempotent.
set -euo pipefail
if python3 -c "import numpy" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(command -v python3)" = /usr/bin/python3 ]; then
    bash "$(dirname "$0")/apt_install.sh" python3-numpy
else
    python3 -m pip install --quiet numpy
fi
if ! python3 -c "import numpy" >/dev/null 2>&1; then
    echo "ensure_job_numpy.sh: $(command -v python3) still cannot import numpy" >&2
    exit 1
fi
