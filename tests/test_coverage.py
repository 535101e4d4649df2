"""A forecaster that knows when it is wrong: realised coverage of the forecasts in use, the
binomial margin, widening a service that under-covers (the tracker, the shared refresh, the
daemon's metrics and ``idlegpu plan``'s warning)."""

from datetime import timedelta
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_regimes import pool

from idlegpu.forecast.capacity import FREE, forecast_pool_usage
from idlegpu.forecast.scenarios import pool_forecast_usage
from idlegpu.forecast.schema import REPLICAS, metric_rows
from idlegpu.forecast.synthetic import generate_pool_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.coverage import Promise, binomial_cdf, coverage_bound, in_use, score
from idlegpu.scheduler.daemon import Daemon, ForecastProvider
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.replay import forecast_free

REPO = Path(__file__).resolve().parents[1]
TZ = "Asia/Seoul"
START = pd.Timestamp("2025-11-24T17:00", tz=TZ).tz_convert("UTC")  # a Monday evening


def test_binomial_margin():
    assert binomial_cdf(150, 168, 0.9) == pytest.approx(
        sum(comb(168, i) * 0.9**i * 0.1 ** (168 - i) for i in range(151)))
    # a week of hourly samples: below 86 % covered is below 0.9 by more than chance; a day: 79 %
    assert coverage_bound(168, 0.9) == pytest.approx(145 / 168)
    assert binomial_cdf(144, 168, 0.9) < 0.05 <= binomial_cdf(145, 168, 0.9)
    assert coverage_bound(24, 0.9) == pytest.approx(19 / 24)


def promises(days=7, level=10.0):
    """A promise each evening at 17:00 (UTC here): ``level`` replicas for 48 h."""
    out = []
    for d in range(days + 1):
        made = (START + pd.Timedelta(days=d)).to_pydatetime()
        index = pd.date_range(made, periods=48 * 12, freq="5min")
        out.append(Promise(made, 0.9, {"svc": pd.Series(level, index=index)}))
    return out


def actuals(values):
    index = pd.date_range(START, periods=len(values), freq="5min")
    return pd.DataFrame({"unique_id": "svc/replicas", "ds": index, "y": values})


def test_the_forecasts_in_use_are_stitched_from_their_making_until_the_next():
    made = promises(days=2)
    made[1] = Promise(made[1].made_at, 0.9, {"svc": made[1].replicas["svc"] + 1})
    curve = in_use(made, START.to_pydatetime(),
                   (START + pd.Timedelta(days=3)).to_pydatetime())["svc"]
    days = curve.groupby((curve.index - START) // pd.Timedelta(days=1)).agg(["min", "max"])
    assert days.to_numpy().tolist() == [[10, 10], [11, 11], [10, 10]]
    assert len(curve) == 3 * 288 and curve.index.is_unique


def test_a_launch_widens_and_an_ordinary_day_does_not():
    n = 7 * 288
    now = (START + pd.Timedelta(days=7)).to_pydatetime()
    ordinary = np.full(n, 8.0)
    ordinary[np.arange(n) % 288 < 20] = 11  # 100 minutes a day above the promise: 93 %
    got = score(promises(), actuals(ordinary), now, ["svc"], target=0.9)["svc"]
    assert got.hours == 168 and got.coverage == pytest.approx(1 - 20 / 288)
    assert not got.widened and got.quantile == 0.9
    launch = ordinary.copy()
    launch[-288 + 12 * 9 : -288 + 12 * 20] = 16  # the last day, 11 h at +60 %
    got = score(promises(), actuals(launch), now, ["svc"], target=0.9)["svc"]
    assert got.last_day < got.last_day_bound  # 0.54 of the day < 0.79
    assert got.coverage > got.bound  # the week as a whole would not have told
    assert got.widened and got.quantile == 0.98
    assert "planned with q0.98 until it recovers" in got.describe()
    # recovered: the next day is covered again (the launch still in the week)
    later = np.concatenate([launch, ordinary[:288]])
    got = score(promises(days=8), actuals(later), now + timedelta(days=1), ["svc"],
                target=0.9)["svc"]
    assert not got.widened and got.last_day >= 0.9
    # a slow drift: every day a little under, the week below its bound, the last day too
    drift = np.full(n, 8.0)
    drift[np.arange(n) % 288 < 50] = 11  # 83 % a day
    got = score(promises(), actuals(drift), now, ["svc"], target=0.9)["svc"]
    assert got.coverage < got.bound and got.last_day > got.last_day_bound and got.widened


def test_nothing_to_score_yet_widens_nothing():
    got = score([], actuals(np.full(288, 50.0)), START.to_pydatetime(), ["svc"], target=0.9)
    assert got["svc"].hours == 0 and not got["svc"].widened
    assert "no promise to score yet" in got["svc"].describe()


@pytest.fixture(scope="module")
def launch():
    """The test pool of test_regimes with a +60 % launch on Monday 2025-12-01 09:00, and the
    pool settings with room for it."""
    settings = load_config(REPO / "idlegpu.yaml")
    services = [s.model_copy(update={"max_replicas": s.max_replicas * 3})
                for s in settings.services]
    settings = settings.model_copy(update={"services": services})
    out = {}
    for name, shifts in (("stable", ()), ("launch", (("2025-12-01T09:00", 1.6, 0.0),))):
        frame = generate_pool_history(pool(shifts), seed=11)
        out[name] = frame[frame["unique_id"].str.endswith("/replicas")]
    return settings, out


def evening(day):
    return pd.Timestamp(f"{day}T17:00", tz=TZ).tz_convert("UTC").to_pydatetime()


def test_the_refresh_widens_a_service_after_a_launch_and_not_on_ordinary_days(launch):
    settings, histories = launch
    days = ("2025-11-28", "2025-11-29", "2025-11-30", "2025-12-01", "2025-12-02",
            "2025-12-03")
    widened = {}
    for name, history in histories.items():
        refresher = Refresher(settings)
        for day in days:
            result = refresher.refresh(history, evening(day))
            widened[name, day] = sorted(result.widened)
    # measured: the stable pool never, the launch all four services that evening, two (the
    # small office services) still the next evening, none two days later
    assert all(widened["stable", day] == [] for day in days)
    assert all(widened["launch", day] == [] for day in days[:3])
    assert widened["launch", "2025-12-01"] == ["chat", "code", "embed", "summarize"]
    assert widened["launch", "2025-12-02"]  # still under-covering the next evening
    assert widened["launch", "2025-12-03"] == []  # recovered


def test_a_widened_service_is_planned_with_the_wider_quantile(launch):
    settings, histories = launch
    result = Refresher(settings).refresh(histories["launch"], evening("2025-12-01"))
    assert result.widened == {"chat": 0.98, "code": 0.98, "embed": 0.98, "summarize": 0.98}
    forecast = result.forecast
    assert {"q0.5", "q0.9", "q0.98"} <= set(forecast.columns)
    replicas = metric_rows(histories["launch"], REPLICAS)
    past = replicas[replicas["ds"] < pd.Timestamp(evening("2025-12-01"))]
    plain = pool_forecast_usage(forecast, settings, 0.9, past)[FREE]
    np.testing.assert_array_equal(
        result.free, pool_forecast_usage(forecast, settings, 0.9, past, result.widened)[FREE])
    assert (result.free <= plain).all() and (result.free < plain).sum() > 24  # GPUs held back
    # and the sum of the wider quantiles, the lockstep bound, never promises more
    summed = forecast_pool_usage(forecast, settings, 0.9, result.widened)[FREE]
    assert (result.free >= summed - 1e-9).all()
    # the promise kept for the next refreshes is the q0.9 one, not the wider quantile
    chat = forecast[forecast["unique_id"] == "chat/replicas"]["q0.9"].to_numpy()
    np.testing.assert_array_equal(result.promise.replicas["chat"].to_numpy(), chat)
    # without a widened service, the refresh plans what forecast_free does
    calm = Refresher(settings).refresh(histories["stable"], evening("2025-12-01"))
    assert calm.widened == {}
    free, _ = forecast_free(histories["stable"], settings, evening("2025-12-01"))
    assert list(calm.free.index) == list(free.index)
    np.testing.assert_array_equal(calm.free.to_numpy(), free.to_numpy())


def test_the_daemon_exports_coverage_and_widening(launch):
    settings, histories = launch
    clock = {"now": evening("2025-12-01")}
    provider = ForecastProvider(settings, histories["launch"])
    daemon = Daemon(controller=None, refresh_forecast=provider.refresh,
                    clock=lambda: clock["now"])
    assert daemon.refresh()
    body = b"".join(daemon.wsgi({"PATH_INFO": "/metrics"}, lambda *a: None)).decode()
    assert 'idlegpu_forecast_widened{service="chat"} 1.0' in body
    chat = next(line for line in body.splitlines()
                if line.startswith('idlegpu_forecast_coverage{service="chat"}'))
    assert 0.8 < float(chat.split()[-1]) < 0.95
    assert provider.profile is provider.last.profile and provider.last.widened
    stable = ForecastProvider(settings, histories["stable"])
    daemon = Daemon(controller=None, refresh_forecast=stable.refresh, clock=lambda: clock["now"])
    assert daemon.refresh()
    body = b"".join(daemon.wsgi({"PATH_INFO": "/metrics"}, lambda *a: None)).decode()
    assert 'idlegpu_forecast_widened{service="chat"} 0.0' in body


def grown_pool_config(tmp_path: Path, settings) -> Path:
    """The sample config with every service's max_replicas tripled, as the synthetic pools of
    these tests (room to grow) have them."""
    config = tmp_path / "pool.yaml"
    text = (REPO / "idlegpu.yaml").read_text()
    for service in load_config(REPO / "idlegpu.yaml").services:
        text = text.replace(f"max_replicas: {service.max_replicas}\n",
                            f"max_replicas: {service.max_replicas * 3}\n", 1)
    config.write_text(text)
    assert [s.max_replicas for s in load_config(config).services] == [
        s.max_replicas for s in settings.services]
    return config


def test_plan_warns_about_the_services_it_widens(launch, tmp_path, cli):
    settings, histories = launch
    config = grown_pool_config(tmp_path, settings)
    history = tmp_path / "h.parquet"
    histories["launch"].to_parquet(history)
    code, _, err = cli(["plan", "--history", str(history), "--config", str(config),
                        "--jobs", str(REPO / "data/sample/jobs.yaml"), "--now",
                        "2025-12-01T17:00:00+09:00", "--out", str(tmp_path / "plan")])
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warned) >= 4 and any(line.startswith("warning: code:") for line in warned)
    assert "planned with q0.98" in err
    code, _, err = cli(["plan", "--history", str(history), "--config", str(config),
                        "--jobs", str(REPO / "data/sample/jobs.yaml"), "--now",
                        "2025-11-28T17:00:00+09:00", "--out", str(tmp_path / "plan2")])
    assert code == 0, err
    assert "q0.98" not in err
