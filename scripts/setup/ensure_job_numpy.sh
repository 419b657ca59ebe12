#!/usr/bin/env bash
# Make sure the `python3` a site's jobs run can import numpy: examples/jacobi2d.py, the AppLeS
# paper's Jacobi2D, runs as the components of a co-allocated job and its tests run it on fleets.
# That is the first python3 on the brokers' PATH *that the job's account can reach*: under a root
# broker jobs run as accounts of their own, to whom a python3 under a 0700 home (pyenv's in
# /root) is out of reach, so they get the next one (Debian's /usr/bin/python3). Each of the two
# (ours, and the one an unprivileged account finds) gets numpy: Debian's own python3 from
# python3-numpy (pip may not install into it, PEP 668), another from pip. Idempotent.
set -euo pipefail
candidates=("$(command -v python3)")
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    theirs=$(setpriv --reuid 65534 --regid 65534 --clear-groups \
        env PATH="$PATH" sh -c 'command -v python3' 2>/dev/null || true)
    [ -n "$theirs" ] && [ "$theirs" != "${candidates[0]}" ] && candidates+=("$theirs")
fi
for python in "${candidates[@]}"; do
    if "$python" -c "import numpy" >/dev/null 2>&1; then
        continue
    fi
    if [ "$(readlink -f "$python")" = "$(readlink -f /usr/bin/python3)" ]; then
        bash "$(dirname "$0")/apt_install.sh" python3-numpy
    else
        "$python" -m pip install --quiet numpy
    fi
    if ! "$python" -c "import numpy" >/dev/null 2>&1; then
        echo "ensure_job_numpy.sh: $python still cannot import numpy" >&2
        exit 1
    fi
done
