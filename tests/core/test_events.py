"""The catalogue (gbroker.core.events): every event and command the core has, each in one alias."""

from __future__ import annotations

import dataclasses
import inspect
from typing import get_args

import pytest

from gbroker.core import events
from gbroker.core.events import BrokerCommand, BrokerEvent, Command, Event, Fetch, SiteCommand


def _classes() -> list[type]:
    return [
        obj
        for _, obj in inspect.getmembers(events, inspect.isclass)
        if obj.__module__ == events.__name__
    ]


def test_every_class_of_the_catalogue_is_an_event_or_a_command_and_none_is_both() -> None:
    taken, given = set(get_args(Event)), set(get_args(Command))
    assert set(_classes()) == taken | given
    assert not taken & given
    assert given == set(get_args(BrokerCommand)) | set(get_args(SiteCommand)) | {Fetch}
    assert taken == set(get_args(BrokerEvent))
    assert set(events.__all__) >= {cls.__name__ for cls in _classes()}


@pytest.mark.parametrize("cls", _classes(), ids=lambda cls: cls.__name__)
def test_every_event_and_command_is_a_frozen_value(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_old_import_paths_still_work() -> None:
    from gbroker.core import dispatch, health, site

    assert dispatch.Kill is events.Kill
    assert dispatch.SiteExcluded is health.SiteExcluded is events.SiteExcluded
    assert site.Launch is events.Launch
    assert site.SiteCommand is events.SiteCommand
