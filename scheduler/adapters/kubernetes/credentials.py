"""The Kubernetes API client's configuration: a kubeconfig file and context, or the pod's
service account (``load_client_configuration``), for the adapter, the Lease, the job API's
TokenReview and the remote CLI."""

from __future__ import annotations

import os

import kubernetes

from idlegpu.forecast.errors import PermanentError


def load_client_configuration(kubeconfig: str | None = None, context: str | None = None,
                              in_cluster: bool = False) -> kubernetes.client.Configuration:
    """The API client's configuration from a kubeconfig file (default ``~/.kube/config`` or
    ``$KUBECONFIG``) and context, or from the pod's service account when ``in_cluster`` (also
    when neither is named, none is found and the process runs in a pod). A failure is one
    ``PermanentError`` line saying where it looked."""
    from kubernetes import config as kube_config

    configuration = kubernetes.client.Configuration()
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            try:
                kube_config.load_kube_config(config_file=kubeconfig, context=context,
                                             client_configuration=configuration)
            except (kube_config.ConfigException, OSError, TypeError):
                # no kubeconfig named and none found: inside a pod, its service account
                if kubeconfig is not None or context is not None or not os.environ.get(
                        "KUBERNETES_SERVICE_HOST"):
                    raise
                kube_config.load_incluster_config(client_configuration=configuration)
                in_cluster = True
    except (kube_config.ConfigException, OSError, TypeError) as exc:
        where = "in-cluster service account" if in_cluster else (
            f"kubeconfig {kubeconfig or '(default)'}" + (f" context {context}" if context
                                                         else ""))
        msg = " ".join(str(exc).split())
        raise PermanentError(f"cannot load Kubernetes config from {where}: {msg}") from None
    return configuration
