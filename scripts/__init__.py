"""The scripts that set GBroker up, measure it, reproduce its papers' experiments and test how
well it is tested; one folder per purpose:

- ``scripts/setup/``: shell scripts that install what the code and the tests need
  (``bash scripts/setup/setup.sh``: the ``.venv``; ``ensure_*.sh``: CRIU, Slurm, Grid Engine,
  MPI, Mosquitto, Docker, Chromium; ``setup-vm.sh``: the cgroup v2 VM's parts).
- ``scripts/bench/``: benchmarks, each a figure of speed or cost (``bench_*.py``).
- ``scripts/experiments/``: the papers' experiments and figures on the simulator (``exp_*.py``,
  ``fig*.py``) and on real fleets, and the peers they compare with.
- ``scripts/quality/``: how good the tests are (mutation testing, planted bugs) and the cgroup v2
  VM they run in.

``scripts/test.sh`` runs the test suite (README.md, ``.ci/run``). Beside it, the modules the
scripts share: :mod:`scripts.options` (their options ``--seeds``, ``--json``, ``--dask`` and
``--plot``) and :mod:`scripts.orderly` (stopping what a script started).

The Python scripts are modules of this package, run from the checkout's root as
``python -m scripts.experiments.exp_koala ...``; they import ``gbroker`` and each other as
packages, never through ``sys.path``. Statistics belong to the package
(:func:`gbroker.sim.experiment.estimate`), not here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT"]

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: its topologies, traces and examples."""
