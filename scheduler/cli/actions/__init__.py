"""What the commands of ``idlegpu`` do, apart from how they are called.

A command's module of ``idlegpu.scheduler.cli`` (``planning``, ``jobs``...) holds its signature:
the Typer function with its options and help texts, importing only what starts fast (typer,
rich, ``common``, ``registry``). Its body imports its module here inside the function and calls
the function of the same name with every option as a keyword. The modules here import their
work at their top (pandas, the forecasters, the simulator, the job store's services), so that
``idlegpu plan --help`` loads none of it, and ``idlegpu plan`` all of it, once.
"""
