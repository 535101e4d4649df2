"""idlegpu run --once: one real controller pass replayed against the sample history."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_run_once_dry_run_replays_a_past_evening(tmp_path, cli):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    code, _, err = cli(["submit", str(REPO / "examples/jobs/pretrain.yaml"), "--store", store,
                        "--now", "2026-01-28T17:00:00+09:00"])
    assert code == 0, err
    code, out, err = cli(["run", "--once", "--dry-run", "--config", str(REPO / "idlegpu.yaml"),
                          "--now", "2026-01-28T20:00:00+09:00",
                          "--history", str(REPO / "data/sample/history.parquet"),
                          "--store", store, "--runs", str(REPO / "data/sample/runs.csv")])
    assert code == 0, err
    assert "admit" in out, out
    assert "kind: Job" in out and "nvidia.com/gpu: '32'" in out
    assert "priorityClassName: idlegpu-best-effort" in out
    assert "1 Job(s) would be created" in out
    code, out, _ = cli(["queue", "--store", store])
    assert "queued" in out and "admitted" not in out  # a dry run records nothing


def test_run_needs_once_for_a_replay(tmp_path, cli):
    code, _, err = cli(["run", "--config", str(REPO / "idlegpu.yaml"),
                        "--now", "2026-01-28T20:00:00+09:00"])
    assert code == 2 and "use it with --once" in err


def test_speed_only_paces_a_replayed_daemon(tmp_path, cli):
    code, _, err = cli(["run", "--once", "--config", str(REPO / "idlegpu.yaml"),
                        "--now", "2026-01-28T20:00:00+09:00", "--speed", "60",
                        "--history", str(REPO / "data/sample/history.parquet")])
    assert code == 2 and "--speed paces a replayed daemon" in err
