"""The options the scripts share, spelled, checked and explained once::

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_seeds(parser, default=5)
    options.add_dask(parser)
    options.add_json(parser)
    options.add_plot(parser, "the response change against T")

- ``--seeds K``: K replications, each on a seed of its own. Each figure is then their mean ± its
  95% Student-t half-width with K − 1 degrees of freedom (:func:`gbroker.sim.experiment.estimate`,
  for any K; none with one seed).
- ``--dask ADDRESS|local|serial``: where the runs go (:func:`gbroker.sim.sweep.dask_option`);
  the figures are the same wherever they run.
- ``--json``: the figures as one JSON document on stdout, instead of the table.
- ``--plot PNG``: draw them too (matplotlib: the ``plot`` extra).

A bad value is the user's mistake: argparse's usage and one line (``argument --seeds: takes an
integer >= 1, got 0``), exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_dask", "add_json", "add_plot", "add_seeds", "at_least_one"]


def at_least_one(text: str) -> int:
    """An integer >= 1, as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes an integer >= 1, got {value}")
    return value


def add_seeds(
    parser: argparse.ArgumentParser, default: int | None, what: str = "replications"
) -> None:
    """``--seeds K``; ``default`` None: the script decides (its help says how)."""
    shown = "" if default is None else f" (default {default})"
    parser.add_argument(
        "--seeds",
        type=at_least_one,
        default=default,
        metavar="K",
        help=f"{what}: K runs, each on a seed of its own; each figure is their mean ± its 95%% "
        f"interval (Student's t){shown}",
    )


def add_dask(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--dask ADDRESS|local|serial``; ``default`` None: decided from the number of runs."""
    # Imported here: a benchmark that only takes --json stays a small process to fork.
    from gbroker.sim.sweep import dask_option

    parser.add_argument("--dask", **dask_option(default))


def add_json(parser: argparse.ArgumentParser, what: str = "the figures") -> None:
    """``--json``: ``what`` as JSON on stdout."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def add_plot(parser: argparse.ArgumentParser, what: str) -> None:
    """``--plot PNG``: draw ``what`` into that file."""
    parser.add_argument("--plot", type=Path, metavar="PNG", help=f"draw {what} (a PNG)")
