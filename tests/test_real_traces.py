"""The real-traffic histories in data/real/ and the script that makes them.

No network: the raw rows below are copied verbatim from the pinned source files (see
data/real/README.md), and converting them must give exactly the committed lines.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.models.base import prepare_series
from idlegpu.forecast.schema import validate_history
from idlegpu.forecast.sources import read_history

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "data" / "real"


def _script():
    spec = importlib.util.spec_from_file_location(
        "fetch_real_traces", REPO / "scripts" / "fetch_real_traces.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ft = _script()

# trace -> (first ds, last ds, step, rows per series, missing steps) as data/real/README.md says
DOCUMENTED = {
    "nab-elb": ("2014-04-10T00:00:00Z", "2014-04-24T00:35:00Z", "5min", 4032, 8),
    "msft-ecommerce-api": ("2017-11-01T07:00:00Z", "2018-07-17T06:00:00Z", "1h", 6192, 0),
    "msft-mongodb": ("2018-06-13T00:00:00Z", "2018-06-26T23:55:00Z", "5min", 4032, 0),
    "msft-purchases-02": ("2018-03-15T07:00:00Z", "2018-05-06T06:00:00Z", "1h", 1248, 0),
    "msft-purchases-03": ("2018-03-15T07:00:00Z", "2018-05-06T06:00:00Z", "1h", 1248, 0),
    "msft-purchases-04": ("2018-03-15T07:00:00Z", "2018-05-06T06:00:00Z", "1h", 1248, 0),
    # 14 days at 10 min, offset 0 pinned to 2025-01-06 00:00 in Shanghai; 84 steps every client
    # reports 0 (the data's own collection gap) are missing
    "servegen-m-mid": ("2025-01-05T16:00:00Z", "2025-01-19T15:50:00Z", "10min", 1932, 84),
}


def test_every_trace_is_documented_and_small():
    assert set(DOCUMENTED) == {t.name for t in ft.TRACES}
    readme = (REAL / "README.md").read_text(encoding="utf-8")
    for trace in ft.TRACES:
        assert (REAL / trace.csv).is_file()
        assert trace.name in readme and trace.source.commit in readme
        assert trace.source.path in readme and trace.source.blob in readme
    total = sum(p.stat().st_size for p in REAL.rglob("*") if p.is_file())
    assert total < 3 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_history_is_valid_with_the_documented_span_and_step(name):
    trace = ft.BY_NAME[name]
    first, last, step, rows, missing = DOCUMENTED[name]
    history = read_history(REAL / trace.csv)  # validates (idlegpu.forecast.schema)
    assert list(history.columns) == ["unique_id", "ds", "y"]
    assert sorted(history["unique_id"].unique()) == [f"{name}/replicas", f"{name}/request_rate"]
    series = {s.uid: s for s in prepare_series(history)}
    for s in series.values():
        assert s.step == pd.Timedelta(step) == trace.step
        assert s.values.index[0] == pd.Timestamp(first)
        assert s.values.index[-1] == pd.Timestamp(last)
        assert s.values.notna().sum() == rows
        assert s.values.isna().sum() == missing  # gaps stay gaps
    rate = series[f"{name}/request_rate"].values
    replicas = series[f"{name}/replicas"].values
    assert (rate.dropna() >= 0).all()
    held = replicas.dropna()
    assert series[f"{name}/replicas"].is_integer
    assert held.min() >= trace.min_replicas and held.max() <= trace.max_replicas
    # never fewer replicas than the rate needs right now (scale-up is immediate)
    need = np.clip(np.ceil(rate.dropna() / trace.capacity - 1e-9), trace.min_replicas,
                   trace.max_replicas)
    assert (held >= need.reindex(held.index)).all()


def test_hpa_rule_scales_up_at_once_and_down_after_the_window():
    index = pd.date_range("2026-01-01", periods=10, freq="5min", tz="UTC")
    rate = pd.Series([1, 1, 9, 1, 1, 1, 1, 1, 1, 25], index=index, dtype=float)
    got = ft.hpa_replicas(rate, capacity=2.0, lo=1, hi=8,
                          stabilization=pd.Timedelta(minutes=15))
    # desired 1 1 5 1 1 1 1 1 1 8 (13 capped at 8); the 5 is held for 15 minutes after
    assert got.tolist() == [1, 1, 5, 5, 5, 5, 1, 1, 1, 8]
    gap = rate.drop(index[4])  # a missing sample stays missing
    assert index[4] not in ft.hpa_replicas(gap, capacity=2.0, lo=1, hi=8,
                                           stabilization=pd.Timedelta(minutes=15)).index


NAB_HEAD = """timestamp,value
2014-04-10 00:04:00,94.0
2014-04-10 00:09:00,56.0
2014-04-10 00:14:00,187.0
2014-04-10 00:19:00,95.0
2014-04-10 00:24:00,51.0
2014-04-10 00:29:00,10.0
2014-04-10 00:34:00,49.0
2014-04-10 00:39:00,79.0
2014-04-10 00:44:00,24.0
2014-04-10 00:49:00,73.0
2014-04-10 00:54:00,45.0
2014-04-10 00:59:00,9.0
2014-04-10 01:04:00,33.0
2014-04-10 01:09:00,14.0
2014-04-10 01:14:00,57.0
"""

NAB_GAP = """timestamp,value
2014-04-10 11:09:00,105.0
2014-04-10 11:14:00,68.0
2014-04-10 11:19:00,40.0
2014-04-10 11:24:00,14.0
2014-04-10 11:29:00,6.0
2014-04-10 11:39:00,79.0
2014-04-10 11:44:00,183.0
2014-04-10 11:49:00,138.0
2014-04-10 11:54:00,119.0
2014-04-10 11:59:00,255.0
"""

MONGO_HEAD = """TimeStamp,Value,Label
"2018-06-13T00:00:00Z",482,0
"2018-06-13T00:01:00Z",1302,0
"2018-06-13T00:02:00Z",533,0
"2018-06-13T00:03:00Z",53,0
"2018-06-13T00:04:00Z",345,0
"2018-06-13T00:05:00Z",133,0
"2018-06-13T00:06:00Z",291,0
"2018-06-13T00:07:00Z",70,0
"2018-06-13T00:08:00Z",247,0
"2018-06-13T00:09:00Z",187,0
"2018-06-13T00:10:00Z",118,0
"2018-06-13T00:11:00Z",321,0
"2018-06-13T00:12:00Z",49,0
"2018-06-13T00:13:00Z",261,0
"2018-06-13T00:14:00Z",154,0
"2018-06-13T00:15:00Z",100,0
"2018-06-13T00:16:00Z",257,0
"2018-06-13T00:17:00Z",27,0
"2018-06-13T00:18:00Z",184,0
"2018-06-13T00:19:00Z",329,0
"""

API_HEAD = """TimeStamp,Value,Label
"2017-11-01T00:00:00Z",49.6747222222222,0
"2017-11-01T01:00:00Z",48.4138888888889,0
"2017-11-01T02:00:00Z",42.9927777777778,0
"2017-11-01T03:00:00Z",37.135,0
"2017-11-01T04:00:00Z",33.4227777777778,0
"2017-11-01T05:00:00Z",30.6663888888889,0
"""

# the clocks go back: 01:00 wall clock twice (PDT, then PST)
API_FALL_BACK = """TimeStamp,Value,Label
"2017-11-04T22:00:00Z",83.0797222222222,0
"2017-11-04T23:00:00Z",79.9488888888889,0
"2017-11-05T00:00:00Z",77.4741666666667,0
"2017-11-05T01:00:00Z",74.5658333333333,0
"2017-11-05T01:00:00Z",70.6033333333333,0
"2017-11-05T02:00:00Z",58.0605555555556,0
"2017-11-05T03:00:00Z",51.7408333333333,0
"""

# the clocks go forward: no 02:00 wall clock
API_SPRING_FORWARD = """TimeStamp,Value,Label
"2018-03-10T23:00:00Z",112.792222222222,0
"2018-03-11T00:00:00Z",102.168888888889,0
"2018-03-11T01:00:00Z",97.1541666666667,0
"2018-03-11T03:00:00Z",90.5969444444444,0
"2018-03-11T04:00:00Z",80.9255555555556,0
"""

# hourly purchase counts on the Pacific wall clock: 2690 purchases from 00:00 PDT (07:00 UTC)
PURCHASES_HEAD = """TimeStamp,Value,Label
"2018-03-15T00:00:00Z",2690,0
"2018-03-15T01:00:00Z",1322,0
"2018-03-15T02:00:00Z",735,0
"2018-03-15T03:00:00Z",594,0
"2018-03-15T04:00:00Z",394,0
"2018-03-15T05:00:00Z",395,0
"""


def test_purchase_counts_become_purchases_per_second_on_the_pacific_clock():
    frame = ft.convert(ft.BY_NAME["msft-purchases-03"], PURCHASES_HEAD.encode())
    rate = frame[frame["unique_id"] == "msft-purchases-03/request_rate"]
    assert pd.Timestamp(rate["ds"].iloc[0]) == pd.Timestamp("2018-03-15T07:00:00Z")
    assert rate["y"].iloc[0] == pytest.approx(2690 / 3600, abs=1e-6)


def _committed_lines(trace) -> dict[tuple[str, str], str]:
    lines = (REAL / trace.csv).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "unique_id,ds,y"
    return {tuple(line.split(",")[:2]): line for line in lines[1:]}


@pytest.mark.parametrize(
    "name, raw, warmup",
    [
        ("nab-elb", NAB_HEAD, 0),
        ("nab-elb", NAB_GAP, 7),  # replicas need 30 minutes of the past: compared after it
        ("msft-mongodb", MONGO_HEAD, 0),
        ("msft-ecommerce-api", API_HEAD, 0),
        ("msft-ecommerce-api", API_FALL_BACK, 1),
        ("msft-ecommerce-api", API_SPRING_FORWARD, 1),
        ("msft-purchases-03", PURCHASES_HEAD, 0),
    ],
)
def test_conversion_reproduces_the_committed_rows(name, raw, warmup):
    trace = ft.BY_NAME[name]
    frame = ft.convert(trace, raw.encode())
    text = ft.to_csv_text(frame).splitlines()
    assert text[0] == "unique_id,ds,y"
    committed = _committed_lines(trace)
    compared = expected = 0
    for uid, group in frame.groupby("unique_id", sort=True):
        skip = warmup if uid.endswith("/replicas") else 0
        keep = set(pd.DatetimeIndex(group["ds"]).sort_values()[skip:])
        expected += len(keep)
        for line in text[1:]:
            key = tuple(line.split(",")[:2])
            if key[0] == uid and pd.Timestamp(key[1]) in keep:
                assert committed[key] == line
                compared += 1
    assert compared == expected > 0
    assert validate_history(frame).shape[0] == len(frame)


def test_wall_clock_times_become_utc():
    fall = ft.parse_cmd(API_FALL_BACK, "America/Los_Angeles")
    assert list(fall.index.strftime("%H:%M")) == [
        "05:00", "06:00", "07:00", "08:00", "09:00", "10:00", "11:00"]
    assert fall.iloc[3] == pytest.approx(74.5658333333333)  # 01:00 PDT = 08:00 UTC
    assert fall.iloc[4] == pytest.approx(70.6033333333333)  # 01:00 PST = 09:00 UTC
    spring = ft.parse_cmd(API_SPRING_FORWARD, "America/Los_Angeles")
    assert (spring.index.to_series().diff().dropna() == pd.Timedelta(hours=1)).all()
    with pytest.raises(ValueError, match="does not exist"):  # no 02:00 that day
        ft.parse_cmd('TimeStamp,Value,Label\n"2018-03-11T02:00:00Z",1,0\n',
                     "America/Los_Angeles")


def test_nab_counts_become_requests_per_second_on_the_grid():
    rate = ft.parse_nab(NAB_HEAD)
    assert rate.index[0] == pd.Timestamp("2014-04-10T00:00:00Z")
    assert rate.iloc[0] == pytest.approx(94 / 300)
    assert (rate.index.to_series().diff().dropna() == pd.Timedelta(minutes=5)).all()


def test_raw_files_are_checked_against_the_recorded_blob(tmp_path):
    trace = ft.BY_NAME["msft-mongodb"]
    assert ft.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob
    clone = tmp_path / "cloud-monitoring-dataset"
    raw = clone / trace.source.path
    raw.parent.mkdir(parents=True)
    raw.write_text(MONGO_HEAD, encoding="utf-8")  # a truncated copy: another version
    with pytest.raises(SystemExit, match="another version"):
        ft.read_raw(clone, trace.source)
    with pytest.raises(SystemExit, match="not found"):
        ft.read_raw(tmp_path / "empty", trace.source)


# rows copied verbatim from alibaba/ServeGen data/language/m-mid (commit f891d11): the first
# three steps and the first two of the collection gap (offsets 313,200 and 313,800 s)
SERVEGEN_5 = b"""0,0.26666666666666666,2.1060291982792205,Gamma,0.22546089361916535,15.990752320755316
600,6.503333333333333,7.20586881122233,Weibull,0.3134878953077559,0.027528341328608544
1200,10.915,1.972765589633565,Weibull,0.662691942678083,0.08666301248281168
313200,0,0,,0,0
313800,0,0,,0,0
"""
SERVEGEN_10 = b"""0,25.98,2.881619987461855,Weibull,0.37006838960803945,0.007374370872861301
600,26.141666666666666,3.214460910896532,Weibull,0.36061695246869835,0.007173701205890796
1200,26.111666666666668,3.39676813340311,Weibull,0.34476325127635765,0.005974686093335146
313200,0,0,,0,0
313800,0,0,,0,0
"""


def test_servegen_clients_are_summed_on_the_pinned_clock_and_the_gap_stays_a_gap():
    trace = ft.BY_NAME["servegen-m-mid"]
    got = ft.parse_servegen({"chunk-5-trace.csv": SERVEGEN_5, "chunk-10-trace.csv": SERVEGEN_10},
                            trace.start, trace.step)
    assert list(got.index) == list(pd.date_range("2025-01-05T16:00:00Z", periods=3,
                                                 freq="10min"))  # 00:00 in Shanghai
    assert got.round(6).tolist() == [26.246667, 32.645, 37.026667]
    with pytest.raises(ValueError, match="one per"):
        ft.parse_servegen({"x": b"0,1,0,,0,0\n300,1,0,,0,0\n"}, trace.start, trace.step)


def test_servegen_tenant_groups_split_the_clients_and_name_a_missing_one():
    trace = ft.BY_NAME["servegen-m-mid"]
    files = {f"chunk-{n}-trace.csv": (SERVEGEN_5 if n == 60 else SERVEGEN_10)
             for group in ft.SERVEGEN_TENANTS.values() for n in group}
    files["chunk-999-trace.csv"] = SERVEGEN_5  # a client of the long tail
    clients = ft.servegen_clients(files, trace.start, trace.step)
    rates = ft.servegen_tenant_rates(clients)
    assert list(rates.columns) == ["tenant-a", "tenants-b", "tenants-c", "long-tail"]
    assert rates["tenant-a"].round(6).tolist() == [0.266667, 6.503333, 10.915]
    assert rates["tenants-b"].round(6).tolist() == [51.96, 52.283333, 52.223333]
    assert rates["long-tail"].round(6).tolist() == rates["tenant-a"].round(6).tolist()
    assert rates.sum(axis=1).round(6).tolist() == clients.sum(axis=1).round(6).tolist()
    del files["chunk-36-trace.csv"]
    with pytest.raises(ValueError, match="chunk-36-trace.csv"):
        ft.servegen_tenant_rates(ft.servegen_clients(files, trace.start, trace.step))


def test_the_committed_tenant_rates_add_up_to_the_familys():
    tenants = pd.read_csv(REAL / "servegen-m-mid-tenants.csv")
    family = pd.read_csv(REAL / "servegen-m-mid.csv")
    family = family[family["unique_id"] == "servegen-m-mid/request_rate"].set_index("ds")["y"]
    summed = tenants.groupby("ds")["y"].sum()
    assert set(tenants["unique_id"]) == {f"servegen-m-mid/{g}/request_rate"
                                         for g in [*ft.SERVEGEN_TENANTS, ft.SERVEGEN_LONG_TAIL]}
    assert list(summed.index) == list(family.index)
    assert (summed - family).abs().max() < 1e-5  # each of four rounded to 6 decimals
    share = tenants.groupby("unique_id")["y"].sum() / family.sum()
    assert share["servegen-m-mid/tenant-a/request_rate"] > 0.5  # the largest client


def test_servegen_manifest_names_every_client_once_with_its_blob():
    entries = ft.read_manifest(REAL / "servegen-m-mid.blobs")
    names = [name for name, _ in entries]
    assert len(names) == len(set(names)) == 109
    assert all(name.startswith("chunk-") and name.endswith("-trace.csv") for name in names)
    assert all(len(blob) == 40 for _, blob in entries)
    assert ("chunk-5-trace.csv", ft.git_blob_id(SERVEGEN_5)) not in entries  # only a part
