"""``idlegpu run``: the admission daemon, or one reconcile pass (``--once``). The command's
signature; what it does is ``idlegpu.scheduler.cli.actions.daemon``, imported when it runs (the
daemon's modules come with the daemon extra), not for its ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    NowOption,
    StoreOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="The admission daemon (or one pass with --once).")
def run(
    config: ConfigOption = DEFAULT_CONFIG,
    once: Annotated[bool, typer.Option("--once", help="One reconcile pass, then exit.")] = False,
    now: NowOption = None,
    history: Annotated[Optional[Path], typer.Option(
        "--history", "-H", help="Replay: signals and forecast from this recorded history "
        "instead of Prometheus (audits, demos).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the Job manifests instead of applying them.")] = False,
    store: StoreOption = None,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    kubeconfig: Annotated[Optional[str], typer.Option(help="Kubeconfig file.")] = None,
    context: Annotated[Optional[str], typer.Option(help="Kubeconfig context.")] = None,
    speed: Annotated[float, typer.Option(
        "--speed", min=0.001, max=100000.0,
        help="Replay only (--history and --now, without --once): seconds of replayed time "
        "per real second, e.g. 60 runs an evening in minutes.")] = 1.0,
) -> None:
    """Admit research Jobs onto the pool's idle GPUs and stop them before the service needs
    the GPUs back: reconcile every minute, live backstop every 15 s, forecast every evening,
    last month's report on the 1st. --once runs a single pass; with --now and --history it
    replays a past moment against recorded history (without --once, the daemon itself runs
    from that moment on, --speed times faster than real time)."""
    from idlegpu.scheduler.cli.actions import daemon as actions  # the controller, the signals

    actions.run(config=config, once=once, now=now, history=history, dry_run=dry_run, store=store,
                runs=runs, kubeconfig=kubeconfig, context=context, speed=speed)
