"""``idlegpu simulate`` and ``plan``: the admission policy on a history and a job trace, and
tonight's dry run of it over the forecast. The commands' signatures; what they do is
``idlegpu.scheduler.cli.actions.planning``, imported when one of them runs (pandas, the
forecasters and the simulator with it), not for their ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    FromLastSampleOption,
    HistoryOption,
    NowOption,
    OutputOption,
    ServerOption,
    TokenFileOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="Compare admission policies on a history and a job trace.")
def simulate(
    history: HistoryOption,
    jobs: Annotated[Path, typer.Option(help="Job trace (YAML), e.g. data/sample/jobs.yaml.")],
    config: ConfigOption = DEFAULT_CONFIG,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = (
        "night,reactive,forecast,oracle,clairvoyant"
    ),
    days: Annotated[
        Optional[int], typer.Option(help="Simulate only this many days from the start.")
    ] = None,
    warmup_days: Annotated[
        int, typer.Option(help="History kept before the start for the first forecast.")
    ] = 14,
    out: Annotated[Path, typer.Option(help="Directory for the CSVs and the chart.")] = Path(
        "out/simulation"
    ),
    placement: Annotated[str, typer.Option(
        help="pool: GPUs counted for the pool as one bin; spread or binpack: on the nodes of "
        "pool.nodes, the services' replicas placed as the kube-scheduler's LeastAllocated "
        "(default) or MostAllocated scoring would, jobs only where a node has room.")] = "pool",
    sweep: Annotated[Optional[str], typer.Option(
        help="Also run the forecast policy at each of these admission confidences (e.g. "
        "0.5,0.7,0.8,0.9,0.95) and draw the frontier of useful GPU-hours against service "
        "delay and lost work beside the other policies (frontier.csv, frontier.png).")] = None,
    saves_on_stop: Annotated[bool, typer.Option(
        "--saves-on-stop", help="Model workloads that save their progress when told to stop "
        "(SIGTERM, in the grace period). Default: a planned stop keeps only what the "
        "periodic checkpoints saved, as a blind SIGTERM does.")] = False,
    checkpoint_notice: Annotated[str, typer.Option(
        help="Planned stops of units that checkpoint come with this much notice (the "
        "cooperative checkpoint, e.g. 10m): the unit saves, answers and leaves, losing "
        "nothing. 0: blind SIGTERMs.")] = "0",
    notice_answer: Annotated[str, typer.Option(
        help="How long after a notice a unit has saved and answered (e.g. 2m).")] = "2m",
    unanswered_share: Annotated[float, typer.Option(
        help="The share of units (0-1) that never answer a notice: stopped blind at its "
        "deadline.")] = 0.0,
    workers: Annotated[Optional[int], typer.Option(
        help="Processes to simulate in: the policies at once, each in its own, and the "
        "forecast policy's evening refits first, a group of services each (the results are "
        "the same as in one). Default: the CPUs this process may use.")] = None,
    forecast_cache: Annotated[Optional[Path], typer.Option(
        help="Directory to keep the forecast policy's nightly forecasts in: a later run on "
        "the same history, config and span (any job trace, policies or notices) reads them "
        "back instead of refitting every evening.")] = None,
) -> None:
    """Replay the pool history and a job trace through the admission policy, for each of
    night (fixed 20:00-08:00), reactive, forecast (ours), oracle (ours on the actual future) and
    clairvoyant (the reference: the actual future, and every unit stops without loss)."""
    from idlegpu.scheduler.cli.actions import planning as actions  # pandas, the simulator

    actions.simulate(history=history, jobs=jobs, config=config, runs=runs, policies=policies,
                     days=days, warmup_days=warmup_days, out=out, placement=placement,
                     sweep=sweep, saves_on_stop=saves_on_stop,
                     checkpoint_notice=checkpoint_notice, notice_answer=notice_answer,
                     unanswered_share=unanswered_share, workers=workers,
                     forecast_cache=forecast_cache)


@app.command(short_help="Tonight's plan: windows, which jobs start when, and why others wait.")
def plan(
    history: Annotated[Optional[Path], typer.Option(
        "--history", "-H", help="History file with columns unique_id, ds, y (.parquet, "
        ".csv[.gz]); not with --server.")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    jobs: Annotated[Optional[Path], typer.Option(
        help="Take the queue from a job trace: requests submitted in the --queue-days before "
        "now (demos on the sample).")] = None,
    store: Annotated[Optional[str], typer.Option(
        "--store", help="Take the queue from this job store (default when --jobs is not given: "
        "store.url of the config).")] = None,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    now: NowOption = None,
    from_last_sample: FromLastSampleOption = False,
    horizon: Annotated[str, typer.Option(help="How far ahead to plan.")] = "24h",
    queue_days: Annotated[float, typer.Option(help="With --jobs: days of submissions.")] = 7.0,
    out: Annotated[Path, typer.Option(
        help="Directory for plan.csv, windows.csv and the chart.")] = Path("out/plan"),
    server: ServerOption = None,
    token_file: TokenFileOption = None,
    output: OutputOption = "table",
) -> None:
    """Forecast the night, then dry-run the admission policy over it: the idle windows, which
    queued jobs start when on how many GPUs, when each finishes or checkpoints and stops, and
    why the rest wait. With --server, the job API's plan (its history, queue and clock).
    With -o csv or json, stdout is the plan's rows (plan.csv's) and nothing else."""
    from idlegpu.scheduler.cli.actions import planning as actions  # pandas, the forecasters

    actions.plan(history=history, config=config, jobs=jobs, store=store, runs=runs, now=now,
                 from_last_sample=from_last_sample, horizon=horizon, queue_days=queue_days,
                 out=out, server=server, token_file=token_file, output=output)
