"""The ``idlegpu`` command: the only place that reads flags and prints for people.

One module per group of commands, each with its own Typer app: ``history``, ``forecasting``,
``planning``, ``daemon``, ``jobs`` (with ``remote``, the same commands through the job API),
``fetching``, ``reports`` and ``server``. The root app of ``common`` finds them through
``registry``, which loads a command's module only when that command runs or shows its help, so
that ``idlegpu --help`` imports none of them. Such a module holds the commands' signatures
alone; what they do is in ``actions`` (``actions.planning``...), which each command imports
when it runs, so that ``idlegpu plan --help`` loads no pandas. ``common`` also holds the
consoles, the shared options and ``main()``; ``inputs`` what the commands read (config,
history). This package keeps the names the console script, the tests and the docs take from
``idlegpu.scheduler.cli``.
"""

from __future__ import annotations

import sys
from types import ModuleType

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
from idlegpu.scheduler.output import plain

__all__ = ["EXTRAS", "app", "console", "err_console", "main", "markup_console",
           "markup_err_console", "parse_time", "plain"]


class _Package(ModuleType):
    """Setting a name of ``__all__`` here (``monkeypatch.setattr(cli, "console", ...)``) sets it
    too in each module of the package loaded so far that holds the same object under that name:
    the commands read it there (a module loaded later takes it from ``common``)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in __all__:
            old = self.__dict__.get(name)
            for module_name, module in list(sys.modules.items()):
                if (module_name.startswith(f"{__name__}.") and module is not None
                        and name in module.__dict__ and module.__dict__[name] is old):
                    setattr(module, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
