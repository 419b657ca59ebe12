from __future__ import annotations

import pytest

from gbroker.core.model import InputFile, Job, JobClass, SiteState
from gbroker.errors import InvalidInput


def test_rigid_job_defaults() -> None:
    job = Job("j1", 4, 100.0)
    assert job.max_rank == 4
    assert job.job_class is JobClass.RIGID
    assert job.planned_time(4) == 100.0


def test_moldable_job_plans_with_linear_speedup() -> None:
    job = Job("j1", 2, 120.0, JobClass.MOLDABLE, max_rank=8)
    assert job.planned_time(8) == pytest.approx(30.0)
    assert Job("j2", 2).planned_time(2) == float("inf")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"id": "", "rank": 1}, "job.id"),
        ({"id": "j", "rank": 0}, "rank"),
        ({"id": "j", "rank": 4, "max_rank": 2, "job_class": JobClass.MOLDABLE}, "max_rank"),
        ({"id": "j", "rank": 2, "max_rank": 4}, "max_rank"),
        ({"id": "j", "rank": 1, "requested_time": -5.0}, "requested_time"),
        ({"id": "j", "rank": 1, "requested_time": float("nan")}, "requested_time"),
    ],
)
def test_invalid_jobs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Job(**kwargs)  # type: ignore[arg-type]
    assert field in info.value.field


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 0), "total_cores"),
        ((4, 5), "free_cores"),
        ((4, -1), "free_cores"),
        ((4, 2, -1), "queued"),
    ],
)
def test_invalid_site_states_name_the_field(args: tuple[int, ...], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        SiteState(*args)


@pytest.mark.parametrize("cpu", [0, 0.0, -0.5, 1.01, float("nan"), float("inf"), True, "0.5"])
def test_a_cpu_availability_outside_0_to_1_is_refused_naming_site_cpu(cpu: object) -> None:
    with pytest.raises(InvalidInput) as info:
        SiteState(4, 2, cpu=cpu)  # type: ignore[arg-type]
    assert str(info.value).startswith("site.cpu: expected a fraction of a core, 0 < cpu <= 1")


def test_a_site_state_carries_its_cpu_availability_or_none() -> None:
    assert SiteState(4, 2).cpu is None
    assert SiteState(4, 2, cpu=0.25).cpu == 0.25
    assert SiteState(4, 2, cpu=1).cpu == 1


def test_load_per_core() -> None:
    assert SiteState(8, 0, queued=4).load_per_core == 0.5


def test_input_file_validation() -> None:
    with pytest.raises(InvalidInput, match="size"):
        InputFile("data", -1, "x")
    with pytest.raises(InvalidInput, match="site"):
        InputFile("data", 1, "")


def test_shareable_cores_are_busy_cores_not_shrinkable_and_count_for_sharing_jobs_only() -> None:
    from gbroker.core.malleable import Initiative, Malleability, SizeRule

    with pytest.raises(InvalidInput) as caught:
        SiteState(8, 2, shrinkable=3, shareable=4)
    assert str(caught.value) == (
        "site.shareable: expected between 0 and the busy cores not shrinkable (3), got 4"
    )
    with pytest.raises(InvalidInput, match=r"site\.shareable"):
        SiteState(8, 2, shareable=-1)
    state = SiteState(8, 2, 1, 3, shareable=6, cpu=0.5)
    sharing = Job("j", 2, 60.0, JobClass.MALLEABLE, 4)
    assert sharing.shares_cores
    assert state.for_job(sharing) == SiteState(8, 2, 1, 3, shrinkable=6, cpu=0.5)
    others = [
        Job("r", 2, 60.0),
        Job("m", 2, 60.0, JobClass.MOLDABLE, 4),
        Job(
            "ft",
            2,
            60.0,
            JobClass.MALLEABLE,
            4,
            malleability=Malleability(SizeRule.parse("power2")),
        ),
        Job(
            "e",
            2,
            60.0,
            JobClass.MALLEABLE,
            4,
            malleability=Malleability(initiative=Initiative.APPLICATION),
        ),
    ]
    for job in others:
        assert not job.shares_cores
        assert state.for_job(job) == SiteState(8, 2, 1, 3, cpu=0.5)
    plain = SiteState(8, 2, shrinkable=3)
    assert plain.for_job(sharing) is plain
