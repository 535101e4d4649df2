"""idlegpu scheduler: the ``idlegpu`` command, and (later) admission of research jobs."""
