import gzip

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.schema import infer_step, split_series_id, validate_history
from idlegpu.forecast.sources import read_history, write_history


def frame(n=5, uid="chat/replicas"):
    return pd.DataFrame(
        {
            "unique_id": [uid] * n,
            "ds": pd.date_range("2025-10-01", periods=n, freq="5min", tz="UTC"),
            "y": np.arange(n, dtype=float),
        }
    )


def test_naive_and_string_timestamps_are_utc():
    naive = frame().assign(ds=lambda f: f["ds"].dt.tz_localize(None))
    strings = frame().assign(ds=lambda f: f["ds"].dt.strftime("%Y-%m-%dT%H:%M:%S+09:00"))
    assert validate_history(naive)["ds"].iloc[0] == pd.Timestamp("2025-10-01T00:00Z")
    assert validate_history(strings)["ds"].iloc[0] == pd.Timestamp("2025-09-30T15:00Z")


def test_duplicate_timestamps_are_refused_with_an_example():
    dup = pd.concat([frame(), frame().iloc[[2]]])
    with pytest.raises(HistoryError, match=r"2 rows share .* chat/replicas at 2025-10-01T00:10"):
        validate_history(dup)


def test_non_numeric_values_are_refused_naming_the_row():
    bad = frame().astype({"y": object})
    bad.loc[3, "y"] = "lots"
    with pytest.raises(HistoryError, match=r"non-numeric y 'lots' for series chat/replicas"):
        validate_history(bad)


def test_missing_columns_and_bad_timestamps():
    with pytest.raises(HistoryError, match="missing column"):
        validate_history(frame().rename(columns={"y": "value"}))
    bad = frame().astype({"ds": object})
    bad.loc[1, "ds"] = "yesterday"
    with pytest.raises(HistoryError, match="unreadable timestamp 'yesterday'"):
        validate_history(bad)


def test_nan_values_become_gaps_and_rows_are_sorted():
    f = pd.concat([frame(uid="b/replicas"), frame(uid="a/replicas")], ignore_index=True)
    f.loc[f.index[1], "y"] = np.nan
    out = validate_history(f)
    assert list(out["unique_id"].unique()) == ["a/replicas", "b/replicas"]
    assert len(out) == 9
    assert infer_step(out) == pd.Timedelta("5min")


def test_series_ids():
    assert split_series_id("code/kv_cache_usage") == ("code", "kv_cache_usage")
    assert split_series_id("plain") == ("plain", "")


@pytest.mark.parametrize("name", ["h.parquet", "h.csv", "h.csv.gz"])
def test_round_trip_and_determinism(tmp_path, name):
    f = pd.concat([frame(uid="b/replicas"), frame(uid="a/kv_cache_usage")])
    f["y"] = f["y"] / 3
    path = write_history(f, tmp_path / name)
    first = path.read_bytes()
    write_history(f, path)
    assert path.read_bytes() == first
    back = read_history(path)
    expected = validate_history(f)
    tolerance = 0 if name.endswith("parquet") else 1e-9
    assert (back["unique_id"] == expected["unique_id"]).all()
    assert (back["ds"] == expected["ds"]).all()
    assert np.allclose(back["y"], expected["y"], rtol=tolerance, atol=0)


def test_gzip_header_has_no_timestamp(tmp_path):
    path = write_history(frame(), tmp_path / "h.csv.gz")
    assert path.read_bytes()[4:8] == b"\x00\x00\x00\x00"  # MTIME field
    assert gzip.decompress(path.read_bytes()).startswith(b"unique_id,ds,y\n")


def test_unreadable_files(tmp_path):
    with pytest.raises(HistoryError, match="not found"):
        read_history(tmp_path / "none.parquet")
    (tmp_path / "h.txt").write_text("x")
    with pytest.raises(HistoryError, match="unknown history format"):
        read_history(tmp_path / "h.txt")
    (tmp_path / "h.parquet").write_text("not parquet")
    with pytest.raises(HistoryError, match="cannot read history"):
        read_history(tmp_path / "h.parquet")
