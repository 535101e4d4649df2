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


# --- what users wrote is printed as it is, never as rich markup (issue 13, item 5) ------------

MARKUP = "[on black][black]hidden[/] [/] [bold :x:"


def test_cancel_of_a_markup_id_is_one_plain_line(tmp_path, cli):
    code, out, err = cli(["cancel", "[/]", "--store", f"sqlite:///{tmp_path / 'j.db'}"])
    assert code == 2 and out == ""
    assert "error: no job request or unit '[/]'" in err and "Traceback" not in err


def test_reasons_args_and_paths_are_printed_verbatim(tmp_path, cli, monkeypatch):
    import yaml

    from rich.console import Console

    import idlegpu.scheduler.cli as cli_module

    # the queue's table on one line per unit: a console as wide as COLUMNS=400 makes it (the
    # command's console reads COLUMNS when it is made, which a test runner may have set)
    monkeypatch.setattr(cli_module, "console", Console(markup=False, emoji=False, width=400))

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    request = yaml.safe_load((EXAMPLES / "pretrain.yaml").read_text())
    request["args"] = [*request["args"], "--note", MARKUP]
    request["description"] = MARKUP
    path = tmp_path / "[bold]odd [on black]name.yaml"
    path.write_text(yaml.safe_dump(request))
    code, out, err = cli(["submit", str(path), "--store", store, "--now", NOW])
    assert code == 0, err
    request_id = out.split(" as ")[1].split(":")[0].strip()
    code, out, err = cli(["cancel", request_id, "--store", store, "--now", NOW,
                          "--reason", MARKUP + " \x1b[2J\x07"])
    assert code == 0, err
    code, out, err = cli(["queue", "--all", "--store", store])
    assert code == 0, err
    assert f"cancelled: {MARKUP} \\x1b[2J\\x07" in out, out
    assert "\x1b" not in out and "\x07" not in out  # control characters never reach the terminal
    # a missing file whose name looks like markup: the one error line shows it
    code, _, err = cli(["submit", str(tmp_path / "[/]x.yaml"), "--store", store])
    assert code == 2 and "[/]x.yaml: file not found" in err


def test_the_dry_run_manifest_and_decisions_show_markup_verbatim(tmp_path, cli):
    import yaml

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    request = yaml.safe_load((EXAMPLES / "pretrain.yaml").read_text())
    request["args"] = [*request["args"], "--note", MARKUP]
    request["env"] = {**request.get("env", {}), "NOTE": MARKUP}
    path = tmp_path / "markup.yaml"
    path.write_text(yaml.safe_dump(request))
    assert cli(["submit", str(path), "--store", store,
                "--now", "2026-01-28T17:00:00+09:00"])[0] == 0
    code, out, err = cli(["run", "--once", "--dry-run", "--config", str(REPO / "idlegpu.yaml"),
                          "--store", store, "--now", "2026-01-28T20:00:00+09:00",
                          "--history", str(REPO / "data/sample/history.parquet"),
                          "--runs", str(REPO / "data/sample/runs.csv")])
    assert code == 0, err
    container = next(yaml.safe_load_all(out))["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-1] == MARKUP
    assert {e["name"]: e.get("value") for e in container["env"]}["NOTE"] == MARKUP
    assert MARKUP in out and "1 Job(s) would be created" in err


def test_plain_writes_control_characters_out():
    from idlegpu.scheduler.cli import plain

    assert plain("a\x1b[2Jb\x07\tc\n") == "a\\x1b[2Jb\\x07\tc\n"
    assert plain(MARKUP) == MARKUP


def test_the_manifest_keeps_yaml_line_breaks_in_strings():
    import yaml

    from idlegpu.scheduler.cli.actions.daemon import manifest_stream

    for value in ("\x85", "a\x85b", "a\u2028b\u2029", MARKUP):
        assert yaml.safe_load(manifest_stream([{"v": value, value: 1}])) == {"v": value, value: 1}


def test_the_queue_shows_a_checkpoint_notice_under_way(tmp_path, cli):
    import json
    from datetime import datetime, timedelta

    from idlegpu.scheduler.adapters.store import JobStore

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    request = tmp_path / "noticed.yaml"
    request.write_text("name: noticed\nteam: nlp\nkind: sft\n"
                       "image: registry.example.com/research/train:1.0\ngpus: 4\n"
                       "runtime_estimate: 2h\ncheckpoint: {interval: 30m, notice: true}\n")
    code, _, err = cli(["submit", str(request), "--store", store, "--now", NOW])
    assert code == 0, err
    now = datetime.fromisoformat(NOW)
    with JobStore(store) as jobs:
        (unit,) = jobs.queue()
        assert unit.spec.answers_notice
        jobs.admit(unit.id, now)
        jobs.started(unit.id, now)
        jobs.send_notice(unit.id, now + timedelta(hours=1), now + timedelta(hours=1, minutes=10),
                         "the forecast's ramp")
    code, out, _ = cli(["queue", "--store", store, "--config", str(REPO / "idlegpu.yaml"),
                        "--output", "wide"])
    assert code == 0
    flat = " ".join(out.split())
    assert "checkpoint notice until 19:10:00" in flat  # the pool's zone (Asia/Seoul)
    assert "checkpoint notices: 1 sent, 0 answered in time" in flat and "1 under way" in flat
    code, out, _ = cli(["queue", "--store", store, "--output", "json"])
    (listed,) = json.loads(out)
    assert datetime.fromisoformat(listed["notice_deadline"]) == now + timedelta(hours=1,
                                                                               minutes=10)


def test_queue_lists_kueue_workloads_and_users_jobs_beside_requests(tmp_path, cli):
    """The units outside the store, as the daemon's last pass recorded them, with their
    origin, why they wait and their estimated start."""
    import json
    from datetime import datetime, timedelta

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.types import ExternalUnit

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    code, _, err = cli(["submit", str(EXAMPLES / "eval-sweep.yaml"), "--store", store,
                        "--now", NOW])
    assert code == 0, err
    now = datetime.fromisoformat(NOW)
    with JobStore(store) as jobs:
        jobs.record_external([
            ExternalUnit(id="kueue/nlp/job-long-5f2a1", origin="kueue", namespace="nlp",
                         name="job-long-5f2a1", team="nlp", gpus=8, state="waiting",
                         reason="waits: needs 8 GPUs for 9.0 h; first fits Thu 21:40"),
            ExternalUnit(id="job/vision/train", origin="job", namespace="vision",
                         name="train", team="vision", gpus=4, state="waiting",
                         reason="needs 4 GPUs for 2.0 h", start_at=now + timedelta(hours=3)),
            ExternalUnit(id="job/vision/miner", origin="job", namespace="vision",
                         name="miner", team="vision", gpus=1, state="refused",
                         reason="spec.template.spec.containers[0].image: not from an allowed "
                                "registry"),
        ], now, ["kueue", "job"])
    code, out, _ = cli(["queue", "--store", store, "--config", str(REPO / "idlegpu.yaml"),
                        "--output", "wide"])
    assert code == 0
    flat = " ".join(out.split())
    assert "Kueue Workload" in flat and "first fits Thu 21:40" in flat
    assert "estimated start Wed 21:00" in flat  # 18:00 + 3 h in the pool's zone
    assert "refused: spec.template.spec.containers[0].image" in flat
    assert "1 waiting (Kueue Workload)" in flat and "1 refused (Job)" in flat
    code, out, _ = cli(["queue", "--store", store, "--output", "json"])
    listed = json.loads(out)
    assert {row["origin"] for row in listed} == {"request", "Kueue Workload", "Job"}
    (train,) = [row for row in listed if row["unit"] == "job/vision/train"]
    assert datetime.fromisoformat(train["start_at"]) == now + timedelta(hours=3)
