"""The idlegpu command as a user meets it: help, sample, analyze and one-line errors."""

import importlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer.main
from matplotlib.image import imread
from typer.core import TyperGroup

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.cli import main
from idlegpu.scheduler.cli.registry import COMMANDS

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "history.parquet"
CONFIG = REPO / "idlegpu.yaml"



def test_help_lists_every_command(cli):
    code, out, _ = cli(["--help"])
    assert code == 0
    for command in ("sample", "fetch", "analyze", "export-openmetrics"):
        assert command in out
    code, out, _ = cli(["analyze", "--help"])
    assert code == 0 and "--history" in out and "--min-hours" in out


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("idlegpu")
    result = subprocess.run([exe, "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "idle GPUs" in result.stdout


def test_analyze_the_sample(tmp_path, cli):
    out_dir = tmp_path / "analysis"
    code, out, err = cli(
        ["analyze", "--history", str(SAMPLE), "--config", str(CONFIG), "--out", str(out_dir)]
    )
    assert code == 0, err
    assert "On a typical night 48 GPUs stay idle" in out
    for png in ("idle_heatmap.png", "daily_idle_gpu_hours.png", "pool_last_week.png",
                "idle_depth.png"):
        image = imread(out_dir / png)
        assert image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05  # not a blank canvas
    daily = pd.read_csv(out_dir / "daily_idle.csv", parse_dates=["date"])
    assert len(daily) == 123
    assert daily["idle_gpu_hours"].between(500, 1200).all()
    depth = pd.read_csv(out_dir / "idle_depth.csv", index_col="gpus")
    assert depth.loc[48, "median_hours"] >= 8


def test_sample_regenerates_the_committed_files(tmp_path, cli):
    code, out, err = cli(["sample", "--out", str(tmp_path)])
    assert code == 0, err
    assert (tmp_path / "history.parquet").read_bytes() == SAMPLE.read_bytes()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["analyze", "--history", "missing.parquet", "--config", str(CONFIG)], "not found"),
        (["analyze", "--history", str(SAMPLE), "--config", "nope.yaml"], "config file nope.yaml not found"),
    ],
)
def test_user_errors_are_one_line_without_traceback(args, needle, cli):
    code, out, err = cli(args)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 or needle in err.replace("\n", " ")


def test_unknown_service_in_config(tmp_path, cli):
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace("- name: code ", "- name: coder "))
    code, _, err = cli(["analyze", "--history", str(SAMPLE), "--config", str(config),
                        "--out", str(tmp_path)])
    assert code == 2
    assert "no series coder/replicas" in err and "Traceback" not in err


def test_bad_history_files(tmp_path, cli):
    dup = tmp_path / "dup.csv"
    dup.write_text("unique_id,ds,y\nchat/replicas,2025-10-01T00:00:00Z,1\n"
                   "chat/replicas,2025-10-01T00:00:00Z,2\n")
    code, _, err = cli(["analyze", "--history", str(dup), "--config", str(CONFIG)])
    assert code == 2 and "share a (unique_id, ds) pair" in err and "Traceback" not in err

    text = tmp_path / "text.csv"
    text.write_text("unique_id,ds,y\nchat/replicas,2025-10-01T00:00:00Z,many\n")
    code, _, err = cli(["analyze", "--history", str(text), "--config", str(CONFIG)])
    assert code == 2 and "non-numeric y 'many'" in err


def test_debug_shows_the_traceback(cli):
    with pytest.raises(Exception, match="not found"):
        main(["--debug", "analyze", "--history", "missing.parquet", "--config", str(CONFIG)])


def test_committed_sample_is_readable():
    assert read_history(SAMPLE)["unique_id"].nunique() == 24


def test_export_openmetrics_of_a_history(tmp_path, cli):
    history = tmp_path / "h.csv"
    history.write_text(
        "unique_id,ds,y\n"
        "chat/replicas,2025-10-01T00:00:00Z,4\n"
        "chat/replicas,2025-10-01T00:05:00Z,5\n"
        "chat/prompt_tokens_per_s,2025-10-01T00:00:00Z,10\n"
        "chat/prompt_tokens_per_s,2025-10-01T00:05:00Z,20\n"
    )
    out = tmp_path / "h.om"
    code, _, err = cli(["export-openmetrics", "--history", str(history), "--out", str(out)])
    assert code == 0, err
    text = out.read_text()
    assert text.endswith("# EOF\n")
    assert 'kube_deployment_status_replicas{namespace="inference",deployment="chat"} 5.0 1759277100' in text
    # the counter starts at 0 one step early and adds rate x 300 s per step: 0, 3000, 9000
    assert 'vllm:prompt_tokens_total{model_name="chat"} 9000.0 1759277100' in text


def _built_commands(module: str) -> dict:
    built = typer.main.get_command(importlib.import_module(f"idlegpu.scheduler.cli.{module}").app)
    return dict(built.commands) if isinstance(built, TyperGroup) else {built.name: built}


def test_the_registry_lists_every_command_with_its_own_short_help():
    listed = {}
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        for name, command in _built_commands(module).items():
            listed[name] = (module, command.short_help)
    assert listed == COMMANDS


def test_idlegpu_help_loads_no_command_module_nor_pandas():
    code = ("import sys\nfrom idlegpu.scheduler.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith(('idlegpu', 'pandas'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = set(done.stdout.split("\n")[-2].split())
    assert "idlegpu.scheduler.cli.registry" in loaded
    modules = {f"idlegpu.scheduler.cli.{module}" for module, _ in COMMANDS.values()}
    assert not loaded & (modules | {"idlegpu.scheduler.cli.inputs", "pandas"})
