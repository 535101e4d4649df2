"""The ``idlegpu`` command: the only place that reads flags and prints for people.

One module per group of commands, each registering its commands on the one Typer ``app`` of
``common`` (which also holds the consoles, the shared options and helpers, and ``main()``):
``history``, ``forecasting``, ``planning``, ``daemon``, ``jobs`` (with ``remote``, the same
commands through the job API), ``fetching``, ``reports`` and ``server``. This package imports
them in the order ``idlegpu --help`` lists their commands, and keeps the names the console
script, the tests and the docs take from ``idlegpu.scheduler.cli``.
"""

from __future__ import annotations

# the order of the imports of the groups is the order of their commands in `idlegpu --help`
# isort: skip_file
import sys
from types import ModuleType

from idlegpu.scheduler.cli import history  # sample, export-openmetrics, analyze
from idlegpu.scheduler.cli import forecasting  # forecast, windows, backtest
from idlegpu.scheduler.cli import planning  # simulate, plan
from idlegpu.scheduler.cli import daemon  # run
from idlegpu.scheduler.cli import jobs  # submit, queue, cancel; the admission group
from idlegpu.scheduler.cli import fetching  # fetch
from idlegpu.scheduler.cli import reports  # report
from idlegpu.scheduler.cli import server  # serve; the token group
from idlegpu.scheduler.cli import common
from idlegpu.scheduler.cli.common import (
    EXTRAS,
    app,
    console,
    err_console,
    main,
    markup_console,
    markup_err_console,
    parse_time,
)
from idlegpu.scheduler.cli.daemon import manifest_stream, yaml_needs_quotes
from idlegpu.scheduler.output import plain

__all__ = ["EXTRAS", "app", "console", "err_console", "main", "manifest_stream",
           "markup_console", "markup_err_console", "parse_time", "plain", "yaml_needs_quotes"]

_MODULES = (common, history, forecasting, planning, daemon, jobs, fetching, reports, server)


class _Package(ModuleType):
    """Setting a name of ``__all__`` here (``monkeypatch.setattr(cli, "console", ...)``) sets it
    too in each module of the package that holds the same object under that name: the commands
    read it there."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in __all__:
            old = self.__dict__.get(name)
            for module in _MODULES:
                if name in module.__dict__ and module.__dict__[name] is old:
                    setattr(module, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
