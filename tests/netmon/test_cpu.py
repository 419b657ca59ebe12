"""NWS's CPU availability (netmon.cpu): the sensor's arithmetic, the hybrid, the forecast."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.errors import InvalidInput
from netmon.cpu import FLOOR, CpuAvailability, from_load, from_probe
from netmon.ensemble import MEMBERS


def test_a_new_process_is_one_more_of_the_runnable_ones_on_the_cores() -> None:
    assert from_load(0.0, 1) == 1.0  # an idle core: all of it
    assert from_load(1.0, 1) == 0.5  # one spinner: half
    assert from_load(3.0, 1) == 0.25
    assert from_load(3.0, 2) == 0.5  # three on two cores: the new one is one of four on two
    assert from_load(0.5, 4) == 1.0  # never more than a whole core
    assert from_load(1e6, 1) == FLOOR  # never nothing


def test_a_probe_got_its_cpu_time_over_its_wall_time() -> None:
    assert from_probe(0.01, 0.02) == 0.5
    assert from_probe(0.0201, 0.02) == 1.0  # a clock's granularity: clamped
    assert from_probe(0.0, 0.02) == FLOOR


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: from_load(-1.0, 2), "cpu.load"),
        (lambda: from_load(float("nan"), 2), "cpu.load"),
        (lambda: from_load(1.0, 0), "cpu.cores"),
        (lambda: from_probe(0.01, 0.0), "cpu.probe.wall_seconds"),
        (lambda: from_probe(-0.01, 0.02), "cpu.probe.cpu_seconds"),
        (lambda: CpuAvailability(share=0.0), "site.cpu_share"),
        (lambda: CpuAvailability(share=1.5), "site.cpu_share"),
        (lambda: CpuAvailability().measure(0.0), "cpu.passive"),
        (lambda: CpuAvailability().measure(0.5, 2.0), "cpu.probe"),
    ],
)
def test_bad_figures_name_the_field(call: object, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        call()  # type: ignore[operator]
    assert info.value.field == field


def test_between_probes_the_load_moves_the_value_by_the_last_probes_bias() -> None:
    cpu = CpuAvailability()
    # The load says 0.8, a probe says 0.4: the kernel gives less than the load suggests
    # (another process pinned beside us, a quota): bias -0.4.
    assert cpu.measure(0.8, 0.4) == 0.4
    assert cpu.measure(0.8) == pytest.approx(0.4)
    assert cpu.measure(0.6) == pytest.approx(0.2)  # the load rose: lower still
    assert cpu.measure(0.3) == FLOOR  # never below the floor
    assert cpu.measure(0.3, 0.9) == 0.9  # a new probe: its value, and a new bias of +0.6
    assert cpu.measure(0.5) == 1.0  # clamped to a whole core


def test_a_capped_site_never_gives_more_than_its_share() -> None:
    cpu = CpuAvailability(share=0.5)
    assert cpu.measure(1.0, 1.0) == 0.5
    assert cpu.measure(1.0) == 0.5
    assert cpu.measure(0.3, 0.3) == 0.3  # below the cap, contention decides
    assert cpu.forecast() is not None
    assert cpu.forecast() <= 0.5  # type: ignore[operator]


def test_a_step_from_1_to_half_is_forecast_near_half_after_a_few_samples() -> None:
    cpu = CpuAvailability()
    for _ in range(10):
        cpu.measure(1.0, 1.0)
    assert cpu.forecast() == 1.0
    forecasts = []
    for _ in range(6):
        cpu.measure(0.5, 0.5)
        forecasts.append(cpu.forecast())
    assert forecasts[-1] == pytest.approx(0.5, abs=0.05)
    # "A few": the ensemble had switched to a member that follows the step by the 3rd sample.
    assert forecasts[2] == pytest.approx(0.5, abs=0.05)
    assert cpu.reported == pytest.approx(0.5, abs=0.05)


def test_the_forecast_is_the_least_error_members_prediction() -> None:
    cpu = CpuAvailability()
    # Alternating availability: the last value is always wrong by 0.4, the mean is right
    # within 0.2: a smoothing or mean member forecasts, never "last".
    for i in range(20):
        value = 0.9 if i % 2 else 0.5
        cpu.measure(value, value)
    series = cpu.series
    records = series.records()
    best = min(range(len(MEMBERS)), key=records.__getitem__)
    assert cpu.best() == MEMBERS[best] != "last"
    assert cpu.forecast() == pytest.approx(series.predictions()[best])
    assert records[best] < records[MEMBERS.index("last")]


def test_nothing_is_forecast_or_reported_before_the_first_measurement() -> None:
    cpu = CpuAvailability()
    assert cpu.forecast() is None
    assert cpu.reported is None
    assert cpu.best() is None


def test_the_reported_value_moves_only_by_the_resolution() -> None:
    cpu = CpuAvailability(resolution=0.05)
    cpu.measure(0.8, 0.8)
    assert cpu.reported == 0.8
    cpu.measure(0.82, 0.82)  # jitter: the site need not publish again
    assert cpu.reported == 0.8
    for _ in range(5):
        cpu.measure(0.6, 0.6)
    assert cpu.reported == pytest.approx(0.6, abs=0.05)


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=FLOOR, max_value=1.0),
            st.none() | st.floats(min_value=FLOOR, max_value=1.0),
        ),
        min_size=1,
        max_size=40,
    ),
    st.floats(min_value=FLOOR, max_value=1.0),
)
def test_every_value_and_forecast_is_a_valid_site_cpu(
    samples: list[tuple[float, float | None]], share: float
) -> None:
    cpu = CpuAvailability(share=share)
    for passive, probe in samples:
        value = cpu.measure(passive, probe)
        assert 0 < value <= share
        forecast, reported = cpu.forecast(), cpu.reported
        assert forecast is not None
        assert reported is not None
        assert 0 < forecast <= share
        assert 0 < reported <= share
