"""idlegpu scheduler: the ``idlegpu`` command, the admission policy (pure: ``policy.decide``
takes ``now``), the daemon that starts and stops Kubernetes GPU Jobs in the forecast's windows,
the job store, the job API and web console, the simulator and the monthly reports."""
