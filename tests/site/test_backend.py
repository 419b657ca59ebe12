"""The site back-end seam: a machine's own figures laid over the site's DCSMon state."""

from __future__ import annotations

from pathlib import Path

import pytest

from gbroker.core.model import SiteState
from gbroker.errors import InvalidInput
from gbroker.site.backend import Backend, Capacity, seen_with
from gbroker.site.executor import Executor


def test_the_clusters_own_load_shows_in_the_published_state() -> None:
    own = SiteState(16, 10, queued=2, running=3, shrinkable=4)
    # The cluster's other users hold 12 of its 16 CPUs and queue 5 jobs of their own.
    seen = seen_with(own, Capacity(16, 4, queued=5, running=7))
    assert (seen.total_cores, seen.free_cores, seen.queued, seen.running) == (16, 4, 7, 10)
    assert seen.shrinkable == 4  # still within the busy cores (16 - 4)
    # Idle cluster: the site's own scheduler's view stands.
    assert seen_with(own, Capacity(16, 16)) == SiteState(16, 10, 2, 3, shrinkable=4)
    assert seen_with(own, None) is own
    # SD-Policy's mates' cores are carried over as they are: the machine's own load only ever
    # makes more of its cores busy.
    lending = SiteState(16, 2, running=4, shareable=10)
    assert seen_with(lending, Capacity(16, 16)) == lending
    assert seen_with(lending, Capacity(16, 1)) == SiteState(16, 1, running=4, shareable=10)


def test_draining_survives_and_shrinkable_never_exceeds_the_busy_cores() -> None:
    own = SiteState(8, 2, draining=True, shrinkable=6)
    seen = seen_with(own, Capacity(8, 8))
    assert seen.draining
    assert seen.shrinkable == 6
    assert seen_with(SiteState(8, 8), Capacity(8, 0)).free_cores == 0
    assert seen_with(SiteState(8, 2, cpu=0.3), Capacity(8, 1)).cpu == 0.3  # DCSMon's own figure


@pytest.mark.parametrize("field", ["total_cores", "free_cores", "queued", "running"])
def test_a_capacity_is_counts(field: str) -> None:
    values = {"total_cores": 4, "free_cores": 4, field: -1}
    with pytest.raises(InvalidInput, match=f"capacity.{field}"):
        Capacity(**values)


def test_the_local_back_end_knows_every_core_itself(tmp_path: Path) -> None:
    backend: Backend = Executor(tmp_path, site="s1")
    assert (backend.name, backend.resizes) == ("local", True)
    assert seen_with(SiteState(4, 1), backend.capacity()) == SiteState(4, 1)
