"""Honest configuration: every command says which config it read (or none), warns about series
the config does not describe and refuses a history it describes none of, one holiday calendar
(none by default, a country and subdivision, custom dates) everywhere, and bad options (a
``--now`` past the data, a horizon under a step, out-of-range values) are one line, exit 2,
before anything is fitted."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from forecast_data import TZ, replica_history

from idlegpu.forecast.calendar import SUNDAY_OR_HOLIDAY, WORKING_DAY, HolidayCalendar, day_types
from idlegpu.forecast.config import PoolConfig
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.models import model_for
from idlegpu.scheduler.config import load_config

REPO = Path(__file__).resolve().parents[1]
QS = [0.5]


def pool_data(**pool) -> dict:
    """A one-service pool (``chat``, 4 GPUs a replica) in Seoul."""
    return {
        "pool": {"name": "test-pool", "total_gpus": 40, "headroom_gpus": 0, "timezone": TZ,
                 **pool},
        "query_templates": {"replicas": 'kube_deployment_status_replicas{deployment="$service"}'},
        "services": [{"name": "chat", "gpus_per_replica": 4, "min_replicas": 0,
                      "max_replicas": 10}],
    }


def write_config(tmp_path: Path, name: str = "pool.yaml", **pool) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(pool_data(**pool)))
    return path


def write_history(tmp_path: Path, *uids: str, days: int = 10, step: str = "1h",
                  name: str = "h.csv") -> Path:
    path = tmp_path / name
    pd.concat([replica_history(days=days, step=step, uid=uid) for uid in uids]).to_csv(
        path, index=False)
    return path


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
def no_fitting(monkeypatch):
    """Any model fitted fails the test: the checks must come before. Every module that binds
    ``model_for`` at its import is imported first and patched too: patching the package alone
    misses them once they are imported, and a first import under the patch would keep the
    refusal for every later test in the process."""
    import idlegpu.forecast.models
    import idlegpu.scheduler.cli.actions.forecasting
    import idlegpu.scheduler.replay
    import idlegpu.scheduler.simulate.fits

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the options were checked")

    for module in (idlegpu.forecast.models, idlegpu.scheduler.cli.actions.forecasting,
                   idlegpu.scheduler.replay, idlegpu.scheduler.simulate.fits):
        monkeypatch.setattr(module, "model_for", refuse)


# ------------------------------------------------------------------ the config-in-use line
def test_the_config_line_names_the_file_timezone_and_holidays(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, holiday_country="US", holiday_subdivision="CA",
                          custom_holidays=["2025-11-05", {"date": "2025-11-06", "name": "Launch"}])
    history = write_history(tmp_path, "chat/replicas")
    code, out, err = cli(["forecast", "--history", str(history), "--config", str(config),
                          "--horizon", "2h", "--model", "seasonal_naive",
                          "--out", str(tmp_path / "f.csv")])
    assert code == 0, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("config:")]
    assert line == (f"config: {config.resolve()}; pool test-pool, timezone {TZ}, "
                    "holidays US-CA + 2 custom dates")
    assert "config:" not in out  # stdout stays machine-readable


def test_no_config_says_none_and_defaults(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./idlegpu.yaml here
    history = write_history(tmp_path, "chat/replicas")
    code, _, err = cli(["forecast", "--history", str(history), "--horizon", "2h",
                        "--model", "seasonal_naive", "--out", str(tmp_path / "f.csv")])
    assert code == 0, err
    assert "config: none (no --config, no ./idlegpu.yaml here): defaults, timezone UTC, " \
           "no holidays" in err


def test_the_implicit_idlegpu_yaml_and_env_overrides_are_named(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, name="idlegpu.yaml", holiday_country="KR")
    monkeypatch.setenv("IDLEGPU_POOL__TIMEZONE", "America/New_York")
    code, _, err = cli(["queue", "--store", f"sqlite:///{tmp_path / 'q.db'}"])
    assert code == 0, err
    line = " ".join(err.split())
    assert f"config: {(tmp_path / 'idlegpu.yaml').resolve()} (./idlegpu.yaml of the current " \
           "directory; --config picks another)" in line
    assert "overridden by IDLEGPU_POOL__TIMEZONE" in line
    assert "timezone America/New_York, holidays KR" in line


@pytest.mark.parametrize("given", [["--config", "idlegpu.yaml"], ["-c", "idlegpu.yaml"],
                                   ["--config=idlegpu.yaml"], "env"])
def test_an_explicit_idlegpu_yaml_is_not_called_the_implicit_one(given, tmp_path, cli,
                                                                  monkeypatch):
    # the newcomer's friction: `--config idlegpu.yaml` was announced as "./idlegpu.yaml of the
    # current directory; --config picks another", as if the option had been ignored
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, name="idlegpu.yaml")
    history = write_history(tmp_path, "chat/replicas", days=3)
    args = ["analyze", "--history", str(history), "--out", str(tmp_path / "a")]
    if given == "env":
        monkeypatch.setenv("IDLEGPU_CONFIG", "idlegpu.yaml")
    else:
        args += given
    code, _, err = cli(args)
    assert code == 0, err
    line = " ".join(err.split())
    assert "current directory" not in line
    path = (tmp_path / "idlegpu.yaml").resolve()
    if given == "env":
        assert f"config: {path} (from $IDLEGPU_CONFIG); pool test-pool" in line
    else:
        assert f"config: {path}; pool test-pool" in line


def test_commands_that_need_a_config_announce_it(tmp_path, cli):
    config = write_config(tmp_path)  # no holiday_country: none (the default)
    history = write_history(tmp_path, "chat/replicas", days=3)
    code, _, err = cli(["analyze", "--history", str(history), "--config", str(config),
                        "--out", str(tmp_path / "a")])
    assert code == 0, err
    assert f"config: {config.resolve()}; pool test-pool, timezone {TZ}, no holidays" in err


# ------------------------------------------------------------------ series vs services
def test_series_of_unknown_services_are_named_in_a_warning(tmp_path, cli):
    config = write_config(tmp_path)
    history = write_history(tmp_path, "chat/replicas", "us-east/replicas", days=8)
    code, _, err = cli(["windows", "--history", str(history), "--config", str(config),
                        "--horizon", "6h", "--out", str(tmp_path / "w")])
    assert code == 0, err
    text = " ".join(err.split())
    assert "warning: 1 series of the history belongs to no service of" in text
    assert "(ignored): us-east/replicas" in text
    code, _, err = cli(["forecast", "--history", str(history), "--config", str(config),
                        "--horizon", "2h", "--model", "seasonal_naive",
                        "--out", str(tmp_path / "f.csv")])
    assert code == 0, err
    assert "(forecast without replica bounds): us-east/replicas" in " ".join(err.split())
    assert set(pd.read_csv(tmp_path / "f.csv")["unique_id"]) == {"chat/replicas",
                                                                  "us-east/replicas"}


@pytest.mark.parametrize("command", [
    ["analyze"], ["windows"], ["simulate", "--jobs", "missing.yaml"],
    ["plan", "--jobs", "missing.yaml"],
])
def test_a_history_of_none_of_the_services_is_one_line_exit_2(command, tmp_path, cli,
                                                              no_fitting):
    config = write_config(tmp_path)
    history = write_history(tmp_path, "us-east/replicas", "us-west/replicas", days=8)
    code, _, err = cli([*command, "--history", str(history), "--config", str(config),
                        "--out", str(tmp_path / "o")])
    assert code == 2
    (line,) = error_lines(err)
    assert "none of the history's services (us-east, us-west) is a service of " \
           f"{config.resolve()} (chat): pass --config with this pool's configuration" in line
    assert "Traceback" not in err


def test_forecast_only_warns_when_the_config_describes_none_of_the_series(tmp_path, cli):
    config = write_config(tmp_path)
    history = write_history(tmp_path, "us-east/replicas")
    code, _, err = cli(["forecast", "--history", str(history), "--config", str(config),
                        "--horizon", "2h", "--model", "seasonal_naive",
                        "--out", str(tmp_path / "f.csv")])
    assert code == 0, err
    assert "none of the history's services (us-east) is a service of" in " ".join(err.split())


def test_backtest_warns_and_skips_the_pool_view_the_config_cannot_make(tmp_path, cli):
    config = write_config(tmp_path)
    history = write_history(tmp_path, "us-east/replicas", days=10)
    out = tmp_path / "bt.csv"
    code, _, err = cli(["backtest", "--history", str(history), "--config", str(config),
                        "--days", "1", "--horizon", "6h", "--models", "seasonal_naive",
                        "--out", str(out)])
    assert code == 0, err
    assert "none of the history's services (us-east) is a service of" in " ".join(err.split())
    table = pd.read_csv(out, index_col="model")
    assert "mae" in table.columns and "precision" not in table.columns


# ------------------------------------------------------------------ holidays
def test_no_holidays_is_the_model_default_and_the_sample_keeps_kr():
    assert PoolConfig(total_gpus=8).holiday_country is None
    assert PoolConfig(total_gpus=8).calendar.empty
    assert load_config(REPO / "idlegpu.yaml").pool.calendar == HolidayCalendar("KR")
    assert load_config(REPO / "deploy" / "idlegpu.yaml").pool.holiday_country == "KR"


def test_custom_dates_flip_the_day_kind_to_holiday():
    index = pd.date_range("2025-12-01 12:00", periods=3, freq="D", tz=TZ)  # Mon, Tue, Wed
    plain = load_config(data=pool_data()).pool.calendar
    custom = load_config(data=pool_data(custom_holidays=[
        {"date": "2025-12-02", "name": "Launch"}])).pool.calendar
    assert list(day_types(index, TZ, plain)) == [WORKING_DAY] * 3
    assert list(day_types(index, TZ, custom)) == [WORKING_DAY, SUNDAY_OR_HOLIDAY, WORKING_DAY]
    assert custom.names([date(2025, 12, 2)]) == {date(2025, 12, 2): "Launch"}


def noon_medians(settings, history) -> np.ndarray:
    forecast = model_for("auto", settings).fit(history).predict("1d", QS)
    local = pd.DatetimeIndex(forecast["ds"]).tz_convert(TZ)
    return forecast[local.hour == 12]["q0.5"].to_numpy()


def test_auto_forecasts_a_custom_holiday_like_a_sunday():
    # four weeks ending Sun 2025-11-30: Mon 2025-12-01 is a working day in Korea
    history = replica_history(days=28, start="2025-11-03", uid="chat/replicas")
    plain = load_config(data=pool_data(holiday_country="KR"))
    custom = load_config(data=pool_data(holiday_country="KR", custom_holidays=["2025-12-01"]))
    assert (noon_medians(plain, history) == 8).all()  # the weekday peak
    assert (noon_medians(custom, history) == 4).all()  # the weekend peak


def test_holidays_off_kr_and_us_change_the_forecast():
    # ends Wed 2025-11-26: Thu 11-27 is Thanksgiving in the US, a working day in Korea
    history = replica_history(days=24, start="2025-11-03", uid="chat/replicas")
    off, kr, us = (load_config(data=pool_data(holiday_country=country))
                   for country in (None, "KR", "US"))
    assert (noon_medians(off, history) == 8).all()
    assert (noon_medians(kr, history) == 8).all()
    assert (noon_medians(us, history) == 4).all()
    # and Christmas is a holiday in Korea, not when holidays are off
    history = replica_history(days=38, start="2025-11-17", uid="chat/replicas")
    assert (noon_medians(kr, history) == 4).all()
    assert (noon_medians(off, history) == 8).all()


def test_gbm_prophet_and_the_analysis_use_the_same_calendar():
    from idlegpu.forecast.analysis import analyze_pool
    from idlegpu.forecast.models.gbm_model import GBMForecaster
    from idlegpu.forecast.models.prophet_model import ProphetForecaster

    settings = load_config(data=pool_data(holiday_country="KR",
                                          custom_holidays=["2025-11-12"]))
    calendar = settings.pool.calendar
    index = pd.date_range("2025-11-11 12:00", periods=2, freq="D", tz=TZ)  # Tue, Wed
    features = GBMForecaster(timezone=TZ, holiday_country=calendar)._features(
        index, np.zeros(2), np.arange(2), pd.Timedelta("1h"))
    assert list(features[:, 2]) == [WORKING_DAY, SUNDAY_OR_HOLIDAY]
    frame = ProphetForecaster(timezone=TZ, holiday_country=calendar)._holiday_frame(index)
    days = set(frame["ds"].dt.date)
    assert date(2025, 11, 12) in days and date(2025, 12, 25) in days  # custom, then KR
    assert ProphetForecaster(timezone=TZ)._holiday_frame(index) is None  # no holidays
    history = replica_history(days=14, start="2025-11-03", step="1h", uid="chat/replicas")
    assert analyze_pool(history, settings).holidays == {date(2025, 11, 12): "custom holiday"}


def test_subdivisions_are_validated_against_the_holidays_package():
    ca = load_config(data=pool_data(holiday_country="US", holiday_subdivision="ca")).pool
    assert ca.calendar == HolidayCalendar("US", "CA")
    assert load_config(data=pool_data(holiday_country="US-CA")).pool.calendar == ca.calendar
    chavez = date(2025, 3, 31)  # Cesar Chavez Day: California only
    assert chavez in ca.calendar.names([chavez])
    assert HolidayCalendar("US").names([chavez]) == {}
    with pytest.raises(ConfigError, match=r"holiday_subdivision 'XX' is not a subdivision of "
                       r"US; use one of .*\bCA\b"):
        load_config(data=pool_data(holiday_country="US", holiday_subdivision="XX"))
    with pytest.raises(ConfigError, match="holiday_subdivision needs a holiday_country"):
        load_config(data=pool_data(holiday_subdivision="CA"))
    with pytest.raises(ConfigError, match="pool.custom_holidays.0.date"):
        load_config(data=pool_data(custom_holidays=["2025-13-01"]))


# ------------------------------------------------------------------ --now past the data
@pytest.mark.parametrize("command", [
    ["forecast", "--model", "seasonal_naive", "--out", "f.csv"],
    ["windows", "--out", "w"],
    ["plan", "--store", "sqlite:///s.db", "--out", "p"],
])
def test_now_past_the_history_is_one_line_naming_the_newest_sample(command, tmp_path, cli,
                                                                   monkeypatch, no_fitting):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path)
    history = write_history(tmp_path, "chat/replicas", days=8)  # ends 2025-11-10 14:00 UTC
    code, _, err = cli([*command, "--history", str(history), "--config", str(config),
                        "--now", "2025-11-20T00:00:00Z"])
    assert code == 2
    (line,) = error_lines(err)
    assert "--now 2025-11-20T00:00:00Z is past the end of" in line
    # the pool's zone (Asia/Seoul, the default) with its offset, as every time on the screen
    assert "its newest sample is 2025-11-10T23:00:00+09:00" in line
    assert "--from-last-sample" in line
    assert "Traceback" not in err


def test_from_last_sample_forecasts_from_right_after_it(tmp_path, cli):
    config = write_config(tmp_path)
    history = write_history(tmp_path, "chat/replicas", days=8)
    out = tmp_path / "f.csv"
    code, _, err = cli(["forecast", "--history", str(history), "--config", str(config),
                        "--now", "2025-11-20T00:00:00Z", "--from-last-sample", "--horizon", "3h",
                        "--model", "seasonal_naive", "--out", str(out)])
    assert code == 0, err
    assert "forecasting from right after it, 2025-11-11T00:00:00+09:00 (--from-last-sample)" in \
        " ".join(err.split())
    assert pd.read_csv(out, parse_dates=["ds"])["ds"].min() == pd.Timestamp("2025-11-10 15:00Z")
    code, stdout, err = cli(["plan", "--history", str(history), "--config", str(config),
                             "--now", "2025-11-20T00:00:00Z", "--from-last-sample",
                             "--store", f"sqlite:///{tmp_path / 's.db'}",
                             "--out", str(tmp_path / "p")])
    assert code == 0, err
    assert "Plan from Tue 2025-11-11 00:00 (Asia/Seoul)" in stdout  # 15:00 UTC


def test_now_within_the_newest_samples_step_is_fine(tmp_path, cli):
    history = write_history(tmp_path, "chat/replicas", days=8)  # hourly, last 14:00 UTC
    code, _, err = cli(["forecast", "--history", str(history), "--config",
                        str(write_config(tmp_path)), "--now", "2025-11-10T14:30:00Z",
                        "--horizon", "2h", "--model", "seasonal_naive",
                        "--out", str(tmp_path / "f.csv")])
    assert code == 0, err


# ------------------------------------------------------------------ bad option values
@pytest.mark.parametrize("command", [
    ["forecast", "--out", "f.csv"],
    ["windows", "--out", "w"],
    ["backtest", "--days", "1", "--out", "bt.csv"],
    ["plan", "--store", "sqlite:///s.db", "--out", "p"],
])
def test_a_horizon_under_the_step_is_one_line_before_any_fitting(command, tmp_path, cli,
                                                                monkeypatch, no_fitting):
    monkeypatch.chdir(tmp_path)
    history = write_history(tmp_path, "chat/replicas", days=8)  # an hourly history
    code, _, err = cli([*command, "--history", str(history), "--config",
                        str(write_config(tmp_path)), "--horizon", "30min"])
    assert code == 2
    assert error_lines(err) == [("error: Invalid value for --horizon: 30min is shorter than "
                                 "the history's step (60min); use at least 60min")]
    assert "Traceback" not in err and "Usage:" not in err


@pytest.mark.parametrize(("args", "needle"), [
    (["windows", "--granularity", "0"], "Invalid value for --granularity: use at least 1 GPU"),
    (["windows", "--min-hours", "0"], "Invalid value for --min-hours"),
    (["windows", "--model", "arima"], "Invalid value for --model: choose one of auto"),
    (["backtest", "--cutoff-hour", "24"], "Invalid value for --cutoff-hour"),
    (["backtest", "--days", "0"], "Invalid value for --days: use at least 1 day"),
    (["plan", "--queue-days", "0", "--store", "sqlite:///s.db"], "Invalid value for --queue-days"),
    (["simulate", "--jobs", "j.yaml", "--days", "0"], "Invalid value for --days"),
    (["simulate", "--jobs", "j.yaml", "--checkpoint-notice", "soon"],
     "Invalid value for --checkpoint-notice: 'soon'"),
    (["simulate", "--jobs", "j.yaml", "--checkpoint-notice", "3d"],
     "Invalid value for --checkpoint-notice: '3d': use a duration from 0 to 24h"),
    (["simulate", "--jobs", "j.yaml", "--unanswered-share", "2"],
     "Invalid value for --unanswered-share: use a share from 0 to 1"),
    (["analyze", "--min-hours", "-1"], "Invalid value for --min-hours"),
    (["windows", "--granularity", "many"], "Invalid value for '--granularity'"),
])
def test_bad_option_values_are_one_line_exit_2(args, needle, tmp_path, cli, monkeypatch,
                                               no_fitting):
    monkeypatch.chdir(tmp_path)
    history = write_history(tmp_path, "chat/replicas", days=8)
    code, _, err = cli([*args, "--history", str(history), "--config",
                        str(write_config(tmp_path))])
    assert code == 2
    (line,) = error_lines(err)
    assert needle in line
    assert "Traceback" not in err and "Usage:" not in err


# ------------------------------------------------------------------ a time without an offset
def test_a_now_without_an_offset_is_read_in_the_pools_zone_and_said(tmp_path, cli):
    """Before: read as UTC, so 18:00 typed in Seoul planned from 03:00 the next day."""
    code, out, err = cli(["plan", "--history", str(REPO / "data/sample/history.parquet"),
                          "--config", str(REPO / "idlegpu.yaml"), "--now", "2026-01-28T18:00",
                          "--store", f"sqlite:///{tmp_path / 's.db'}", "--out",
                          str(tmp_path / "p")])
    assert code == 0, err
    said = " ".join(err.split())
    assert ("--now 2026-01-28T18:00 has no offset: read as 2026-01-28T18:00:00+09:00 "
            "(Asia/Seoul, the pool's zone)") in said
    assert said.count("has no offset") == 1
    assert "Plan from Wed 2026-01-28 18:00 (Asia/Seoul)" in " ".join(out.split())


def test_without_a_config_a_time_without_an_offset_is_utc_and_said(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    history = write_history(tmp_path, "chat/replicas", days=8)
    code, _, err = cli(["forecast", "--history", str(history), "--now", "2025-11-10T12:00",
                        "--model", "seasonal_naive", "--horizon", "1h", "--out",
                        str(tmp_path / "f.csv")])
    assert code == 0, err
    assert ("--now 2025-11-10T12:00 has no offset: read as 2025-11-10T12:00:00+00:00 (UTC: no "
            "config names a zone)") in " ".join(err.split())


def test_a_replay_before_the_stores_units_were_submitted_says_so(tmp_path, cli):
    store = f"sqlite:///{tmp_path / 's.db'}"
    code, _, err = cli(["submit", str(REPO / "examples/jobs/datagen.yaml"), "--config",
                        str(REPO / "idlegpu.yaml"), "--store", store, "--now",
                        "2026-01-29T09:00:00+09:00"])
    assert code == 0, err
    base = ["plan", "--history", str(REPO / "data/sample/history.parquet"), "--config",
            str(REPO / "idlegpu.yaml"), "--store", store, "--out", str(tmp_path / "p")]
    code, out, err = cli([*base, "--now", "2026-01-28T18:00:00+09:00"])
    assert code == 0, err
    said = " ".join(out.split())
    assert ("The queue was empty at 2026-01-28T18:00:00+09:00: the store's 4 queued unit(s) "
            "were all submitted later (the first at 2026-01-29T09:00:00+09:00)") in said
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    code, out, _ = cli([*base[:-4], "--store", empty, "--out", str(tmp_path / "q"), "--now",
                        "2026-01-28T18:00:00+09:00"])
    assert code == 0 and "is empty: queue requests with `idlegpu submit`" in " ".join(out.split())
