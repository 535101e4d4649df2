"""``python -m idlegpu.scheduler.cli``: the ``idlegpu`` command."""

from idlegpu.scheduler.cli import main

if __name__ == "__main__":
    main()
