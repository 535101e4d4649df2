"""List commands (queue, plan) never cut an ID and speak -o table|wide|csv|json."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "idlegpu.yaml"
NAME = "a-request-whose-name-fills-most-of-an-80-column-ro"  # 50, the most allowed


def _submit(tmp_path, cli) -> str:
    data = yaml.safe_load((REPO / "examples/jobs/datagen.yaml").read_text(encoding="utf-8"))
    data["name"] = NAME
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    store = f"sqlite:///{tmp_path / 's.db'}"
    code, _, err = cli(["submit", str(path), "-c", str(CONFIG), "--store", store, "--now",
                        "2026-01-28T17:00:00+09:00"])
    assert code == 0, err
    return store


def test_the_queue_table_never_cuts_a_unit_id(tmp_path, cli):
    store = _submit(tmp_path, cli)
    code, out, err = cli(["queue", "-c", str(CONFIG), "--store", store])
    assert code == 0, err
    ids = [line.split()[0] for line in out.splitlines() if line.strip().startswith("a-req")]
    # the id: the name's first 40 characters, a hash, the step and the member: whole
    whole = re.compile(r"^a-request-whose-name-fills-most-of-an-80-[0-9a-f]{8}-0-[0-3]$")
    assert len(ids) == 4 and all(whole.match(i) for i in ids), out


def test_queue_speaks_json_csv_and_wide(tmp_path, cli):
    store = _submit(tmp_path, cli)
    code, out, err = cli(["queue", "-c", str(CONFIG), "--store", store, "-o", "json"])
    assert code == 0, err
    units = json.loads(out)
    assert len(units) == 4 and {u["state"] for u in units} == {"queued"}
    assert units[0]["submitted"] == "2026-01-28T17:00:00+09:00"
    assert isinstance(units[0]["gpus"], int) and units[0]["estimate_source"] == "user"
    code, out, _ = cli(["queue", "-c", str(CONFIG), "--store", store, "-o", "csv"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["unit"] for r in rows] == [u["unit"] for u in units]
    code, out, _ = cli(["queue", "-c", str(CONFIG), "--store", store, "-o", "wide"])
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(units[0]["unit"]))
    assert len(line) > 100  # not fitted to the 80 columns of the test's terminal
    assert units[0]["request"] in line and "main" in line and "0/0" in line  # one line each
    code, _, err = cli(["queue", "-c", str(CONFIG), "--store", store, "-o", "yaml"])
    assert code == 2 and "use one of table, wide, csv, json" in err


def test_plan_json_is_the_plan_rows_and_nothing_else(tmp_path, cli):
    code, out, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"), "--config",
        str(CONFIG), "--jobs", str(REPO / "data/sample/jobs.yaml"), "--runs",
        str(REPO / "data/sample/runs.csv"), "--now", "2026-01-28T18:00:00+09:00", "--out",
        str(tmp_path), "-o", "json"])
    assert code == 0, err
    rows = json.loads(out)  # stdout holds the JSON only
    outcomes = {r["outcome"] for r in rows}
    assert "waits" in outcomes and outcomes & {"finishes", "checkpoints and stops", "runs on"}
    started = [r for r in rows if r["outcome"] != "waits"]
    assert all(r["start"].endswith("+09:00") for r in started)
    assert all(r["start"] is None and r["reason"] for r in rows if r["outcome"] == "waits")
    assert (tmp_path / "plan.csv").is_file() and (tmp_path / "free_gpus.png").is_file()


def test_the_plan_summary_counts_job_units_and_says_so(tmp_path, cli):
    # the newcomer's friction: one request of 4 units was summed up as "4 job(s) start"
    store = _submit(tmp_path, cli)
    code, out, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"), "-c", str(CONFIG),
        "--store", store, "--runs", str(REPO / "data/sample/runs.csv"), "--now",
        "2026-01-28T18:00:00+09:00", "--out", str(tmp_path / "plan")])
    assert code == 0, err
    text = " ".join(out.split())
    started = re.search(r"(\d+) job unit\(s\) start, [\d,]+ GPU-hours planned; (\d+) wait", text)
    assert started, text[-600:]
    assert int(started[1]) + int(started[2]) == 4 and int(started[1]) > 0  # the request's units
    assert "job(s)" not in text


def test_plan_tables_on_80_columns_wrap_between_words_never_inside_one(tmp_path, cli,
                                                                      monkeypatch):
    # the newcomer's friction: "datag / en", "found / ation" at 80 columns or piped
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"), "--config",
        str(CONFIG), "--jobs", str(REPO / "data/sample/jobs.yaml"), "--runs",
        str(REPO / "data/sample/runs.csv"), "--now", "2026-01-28T18:00:00+09:00", "--out",
        str(tmp_path)])
    assert code == 0, err
    with (tmp_path / "plan.csv").open(encoding="utf-8") as f:
        planned = list(csv.DictReader(f))
    started = [r for r in planned if r["outcome"] != "waits"]
    assert started and any(r["team"] == "foundation" for r in started)
    lines = out.splitlines()
    for r in started:  # the unit's row holds its id, team and kind whole
        (line,) = [ln for ln in lines if ln.split()[:1] == [r["job_id"]]]
        assert line.split()[1:3] == [r["team"], r["kind"]], line
    for r in planned:  # and every word of a reason is whole on some line
        if r["outcome"] == "waits" and not r["reason"].startswith("waits for its previous"):
            words = set(" ".join(lines).split())
            assert set(r["reason"].split()) <= words, r["reason"]
    assert max(map(len, lines)) < 120  # as narrow as whole ids and words allow, not unbounded


def test_token_times_carry_the_pool_zones_offset_and_are_never_cut(tmp_path, cli):
    # the newcomer's friction: token expiry in +00:00 beside plans in +09:00, and cut by "…"
    store = f"sqlite:///{tmp_path / 't.db'}"
    code, _, err = cli(["token", "create", "--team", "foundation", "--name", "me", "-c",
                        str(CONFIG), "--store", store, "--now", "2026-01-28T17:00:00+09:00"])
    assert code == 0, err
    assert "valid until 2026-04-28T17:00:00+09:00" in " ".join(err.split())
    code, out, err = cli(["token", "list", "-c", str(CONFIG), "--store", store])
    assert code == 0, err
    (row,) = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["me"]]
    assert row[3:5] == ["2026-01-28T17:00:00+09:00", "2026-04-28T17:00:00+09:00"], row
    assert "…" not in out
