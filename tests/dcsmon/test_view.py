from __future__ import annotations

from dcsmon.view import NeighbourhoodView
from gbroker.core.model import SiteState


def test_keeps_only_the_newest_report_per_site() -> None:
    view = NeighbourhoodView()
    assert view.update("a", SiteState(8, 4), observed_at=10.0)
    assert not view.update("a", SiteState(8, 8), observed_at=5.0)  # late, out of order
    assert not view.update("a", SiteState(8, 8), observed_at=10.0)  # duplicate
    known = view.get("a")
    assert known is not None
    assert known.state.free_cores == 4
    assert view.update("a", SiteState(8, 1), observed_at=12.0)
    assert view.age("a", now=20.0) == 8.0


def test_unknown_and_forgotten_sites() -> None:
    view = NeighbourhoodView()
    view.update("b", SiteState(4, 4), 1.0)
    view.update("a", SiteState(4, 4), 1.0)
    assert view.sites() == ["a", "b"]
    view.forget("a")
    assert view.get("a") is None
    assert view.age("a", 5.0) == float("inf")
    assert view.sites() == ["b"]
