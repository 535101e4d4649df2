"""Which module of ``idlegpu.scheduler.cli`` holds each command, and the line ``idlegpu --help``
shows for it: the root loads a command's module only when that command runs or shows its own
help. ``idlegpu --help`` and a mistyped command load none of them. This is Click's documented
way of lazily loading subcommands (a group whose ``get_command`` imports on demand), with the
listing taken from this table, so that it needs no import either.

A command's module holds only its signature (options, help texts) and imports only what starts
fast; each command function imports its work from ``idlegpu.scheduler.cli.actions`` (pandas,
the forecasters, the simulator at that module's top) when it runs: ``idlegpu plan --help``
loads none of that work (tests/test_cli_startup.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

PACKAGE = "idlegpu.scheduler.cli"
COMMANDS: dict[str, tuple[str, str]] = {
    # name: (its module, its line in `idlegpu --help`), in the order `idlegpu --help` lists them
    "sample": ("history", "Regenerate the bundled sample pool history."),
    "export-openmetrics": ("history", "Write a history as OpenMetrics for promtool."),
    "analyze": ("history", "Where and when the pool's GPUs sit idle."),
    "forecast": ("forecasting", "Forecast every series as quantiles."),
    "windows": ("forecasting", "The coming idle windows, with confidence."),
    "backtest": ("forecasting", "Rolling-origin backtest of forecasters."),
    "simulate": ("planning", "Compare admission policies on a history and a job trace."),
    "plan": ("planning", "Tonight's plan: windows, which jobs start when, and why others wait."),
    "run": ("daemon", "The admission daemon (or one pass with --once)."),
    "submit": ("jobs", "Queue a job request file."),
    "queue": ("jobs", "The job queue: units, states and runtime estimates."),
    "cancel": ("jobs", "Cancel a job request or a unit."),
    "fetch": ("fetching", "Pull the pool's history from Prometheus."),
    "report": ("reports", "Monthly report: useful GPU-hours, GPU equivalents, savings."),
    "serve": ("server", "The job API: an authenticated HTTP front door to the job store."),
    "admission": ("jobs", "Pause or resume admission for the pool; its state."),
    "token": ("server", "Tokens of the job API: create, list, revoke."),
}


def command_group() -> typer.Typer:
    """The Typer app a module registers its commands on, set as the root's (no rich markup:
    job names, reasons and paths print as they are)."""
    return typer.Typer(rich_markup_mode=None, add_completion=False,
                       pretty_exceptions_enable=False)


def load(name: str) -> Any:
    """The click command ``name``, from its module's app (imported now, if not yet)."""
    module = importlib.import_module(f"{PACKAGE}.{COMMANDS[name][0]}")
    built = typer.main.get_command(module.app)
    # an app of one command is that command; of several, a group of them
    return built.commands[name] if isinstance(built, TyperGroup) else built


class _Commands(MutableMapping[str, Any]):
    """The root's commands by name: every name of ``COMMANDS`` is there, its command loaded on
    first lookup (a listing of the names, as a typo's suggestions make, loads nothing)."""

    def __init__(self, registered: MutableMapping[str, Any]) -> None:
        self._loaded = dict(registered)

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._loaded if name not in COMMANDS)

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class LazyGroup(TyperGroup):
    """The root ``idlegpu`` group: its commands come from ``COMMANDS``, each imported when
    looked up; ``idlegpu --help`` lists them from the table."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, short_help) for name, (_, short_help) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
