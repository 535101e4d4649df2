"""The daemon's clocks and the calendar checks made against them (pure: ``now`` is given)."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idlegpu.scheduler.clock import (
    Clock,
    FunctionClock,
    ReplayClock,
    WallClock,
    as_clock,
    daily_boundary,
    monthly_boundary,
    real_seconds,
    refresh_due,
    report_due,
)

SEOUL = "Asia/Seoul"


class Monotonic:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_a_replay_clock_runs_speed_times_faster_on_the_monotonic_clock():
    mono = Monotonic()
    start = datetime(2026, 1, 28, 8, 0, tzinfo=UTC)
    clock = ReplayClock(start, 60, monotonic=mono)
    assert clock.now() == start and clock() == start
    mono.t += 1.5
    assert clock.now() == start + timedelta(seconds=90)
    assert real_seconds(clock, 60) == 1.0 and real_seconds(clock, 15) == 0.25
    with pytest.raises(ValueError):
        ReplayClock(datetime(2026, 1, 1), 60)  # naive
    with pytest.raises(ValueError):
        ReplayClock(start, 0)


def test_clocks_and_plain_callables():
    wall = WallClock()
    assert isinstance(wall, Clock) and wall.speed == 1.0
    assert abs((wall.now() - datetime.now(UTC)).total_seconds()) < 5
    at = datetime(2026, 1, 1, tzinfo=UTC)
    fn = as_clock(lambda: at)
    assert isinstance(fn, FunctionClock) and fn.now() == at and fn.speed == 1.0
    assert as_clock(wall) is wall and isinstance(as_clock(None), WallClock)


def seoul(*args):
    return datetime(*args, tzinfo=ZoneInfo(SEOUL))


def test_the_evening_refresh_is_due_once_17_00_passed_since_the_last_forecast():
    assert refresh_due(seoul(2026, 1, 28, 3, 0), None, SEOUL, 17)  # none yet
    made = seoul(2026, 1, 28, 16, 0)
    assert not refresh_due(seoul(2026, 1, 28, 16, 59, 59), made, SEOUL, 17)
    assert refresh_due(seoul(2026, 1, 28, 17, 0), made, SEOUL, 17)
    made = seoul(2026, 1, 28, 17, 0, 30)
    assert not refresh_due(seoul(2026, 1, 29, 16, 0), made, SEOUL, 17)
    assert refresh_due(seoul(2026, 1, 29, 17, 0, 1), made, SEOUL, 17)
    # UTC instants are compared in the pool's zone: 08:00 UTC is 17:00 in Seoul
    assert refresh_due(datetime(2026, 1, 29, 8, 0, tzinfo=UTC), made, SEOUL, 17)


def test_the_monthly_report_is_due_once_06_00_on_the_1st_passed():
    since = seoul(2026, 1, 20, 12, 0)  # the daemon started (or last reported)
    assert not report_due(seoul(2026, 1, 31, 23, 59), since, SEOUL, 6)
    assert not report_due(seoul(2026, 2, 1, 5, 59), since, SEOUL, 6)
    assert report_due(seoul(2026, 2, 1, 6, 0), since, SEOUL, 6)
    assert report_due(seoul(2026, 2, 14, 6, 0), since, SEOUL, 6)  # down on the 1st: later
    done = seoul(2026, 2, 1, 6, 0, 30)
    assert not report_due(seoul(2026, 2, 28, 23, 0), done, SEOUL, 6)
    assert report_due(seoul(2026, 3, 1, 6, 0), done, SEOUL, 6)
    # January's boundary from early January is December's 1st (year turn)
    assert monthly_boundary(seoul(2026, 1, 1, 5, 0), SEOUL, 6) == seoul(2025, 12, 1, 6, 0)


def test_boundaries_keep_the_local_hour_across_daylight_saving():
    ny = "America/New_York"
    # 2026-03-08: clocks go forward at 02:00; 17:00 local is 21:00 UTC after, 22:00 before
    b = daily_boundary(datetime(2026, 3, 8, 21, 30, tzinfo=UTC), ny, 17)
    assert b.astimezone(UTC) == datetime(2026, 3, 8, 21, 0, tzinfo=UTC)
    b = daily_boundary(datetime(2026, 3, 8, 20, 30, tzinfo=UTC), ny, 17)  # 16:30 local
    assert b.astimezone(UTC) == datetime(2026, 3, 7, 22, 0, tzinfo=UTC)


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                    timezones=st.just(UTC)),
       st.sampled_from([SEOUL, "UTC", "America/New_York", "Europe/Berlin"]),
       st.integers(0, 23))
def test_boundaries_are_the_latest_such_moment_at_or_before_now(now, tz, hour):
    daily = daily_boundary(now, tz, hour)
    assert daily <= now and now - daily < timedelta(days=1, hours=1)
    assert daily.hour == hour or tz != "UTC"  # a DST gap may move a local hour
    monthly = monthly_boundary(now, tz, hour)
    assert monthly <= now and now - monthly < timedelta(days=32)
    assert monthly.day == 1


def test_the_replayed_accuracy_check_refreshes_at_the_daemons_local_hour_across_dst():
    """The monthly report's accuracy replay refreshes when the daemon would: 17:00 by the
    wall clock, also on the day daylight saving time ends (2 Nov 2025 in New York), where
    local midnight plus 17 hours is 16:00."""
    from pathlib import Path

    from idlegpu.forecast.calendar import local_hour
    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.clock import daily_boundary
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.reports import forecast_check_days

    repo = Path(__file__).resolve().parents[1]
    settings = load_config(repo / "idlegpu.yaml")
    tz = "America/New_York"
    settings = settings.model_copy(update={"pool": settings.pool.model_copy(
        update={"timezone": tz})})
    history = read_history(repo / "data/sample/history.parquet")
    first, last = datetime(2025, 11, 1).date(), datetime(2025, 11, 3).date()
    check = forecast_check_days(history, settings, first, last)
    made = sorted(set(check.daily["made_at"]))
    assert made == ["2025-11-01T17:00:00-04:00", "2025-11-02T17:00:00-05:00",
                    "2025-11-03T17:00:00-05:00"]
    for stamp in made:  # the daemon's own boundary, just after each
        moment = datetime.fromisoformat(stamp)
        assert daily_boundary(moment + timedelta(minutes=1), tz, 17) == moment
        assert local_hour(moment.date(), 17, tz) == moment
