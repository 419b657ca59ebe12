"""scripts/options.py: the shared options of the experiment scripts, parsed and checked once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scripts import options


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="exp", exit_on_error=False)
    options.add_seeds(made, default=5)
    options.add_dask(made)
    options.add_json(made)
    options.add_plot(made, "the figures")
    return made


def test_the_defaults_and_the_values() -> None:
    args = parser().parse_args([])
    assert (args.seeds, args.dask, args.json, args.plot) == (5, None, False, None)
    args = parser().parse_args(["--seeds", "12", "--dask", "serial", "--json", "--plot", "f.png"])
    assert (args.seeds, args.json, args.plot) == (12, True, Path("f.png"))
    assert args.dask is not None


@pytest.mark.parametrize(
    ("text", "message"), [("0", "got 0"), ("-3", "got -3"), ("ten", "got 'ten'")]
)
def test_seeds_take_an_integer_of_at_least_one(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"takes an integer >= 1, {message}"):
        options.at_least_one(text)


def test_a_bad_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    made = argparse.ArgumentParser(prog="exp")
    options.add_seeds(made, default=None)
    with pytest.raises(SystemExit) as ended:
        made.parse_args(["--seeds", "0"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "exp: error: argument --seeds: takes an integer >= 1, got 0"
    )
