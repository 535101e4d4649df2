"""idlegpu submit / queue / cancel against a SQLite store, and simulate on a short period."""

from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "jobs"
NOW = "2026-01-28T18:00:00+09:00"


def test_submit_queue_cancel(tmp_path, cli):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    code, out, err = cli(["submit", str(EXAMPLES / "eval-sweep.yaml"), "--store", store,
                          "--now", NOW, "--idempotency-key", "k1"])
    assert code == 0, err
    request_id = out.split(" as ")[1].split(":")[0].strip()
    code, out, _ = cli(["submit", str(EXAMPLES / "eval-sweep.yaml"), "--store", store,
                        "--now", NOW, "--idempotency-key", "k1"])
    assert code == 0 and "already submitted" in out
    code, out, _ = cli(["queue", "--store", store, "--runs", str(REPO / "data/sample/runs.csv")])
    assert code == 0 and out.count("queued") >= 2
    code, out, _ = cli(["cancel", request_id, "--store", store, "--now", NOW])
    assert code == 0 and "cancelled" in out
    code, out, _ = cli(["queue", "--store", store])
    assert "the queue is empty" in out
    code, _, err = cli(["cancel", "no-such-job", "--store", store])
    assert code == 2 and "Traceback" not in err


def test_submit_refuses_a_forbidden_setting(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    text = (EXAMPLES / "datagen.yaml").read_text()
    bad.write_text(text + "\nprivileged: true\n")
    code, _, err = cli(["submit", str(bad), "--store", f"sqlite:///{tmp_path / 'j.db'}"])
    assert code == 2
    assert "privileged" in err and "Traceback" not in err


def test_simulate_writes_tables_and_a_chart(tmp_path, cli):
    code, out, err = cli(["simulate", "--history", str(REPO / "data/sample/history.parquet"),
                          "--jobs", str(REPO / "data/sample/jobs.yaml"),
                          "--runs", str(REPO / "data/sample/runs.csv"),
                          "--policies", "night,oracle", "--days", "5",
                          "--out", str(tmp_path)])
    assert code == 0, err
    table = pd.read_csv(tmp_path / "policies.csv", index_col="policy")
    assert list(table.index) == ["night", "oracle"]
    assert (table["useful_gpu_hours"] > 0).all()
    assert table.loc["oracle", "service_delay_gpu_minutes"] == 0
    assert (tmp_path / "policies.png").stat().st_size > 10_000
    runs = pd.read_csv(tmp_path / "runs_oracle.csv")
    assert set(runs.columns) >= {"job_id", "team", "kind", "gpus", "start", "end", "outcome",
                                 "gpu_hours", "lost_gpu_hours"}
