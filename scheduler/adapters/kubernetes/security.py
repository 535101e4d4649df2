"""The pod security rules every Job manifest is checked against before it is sent
(``check_pod_security``): no host namespaces, no volume sources but claims, scratch space,
ConfigMaps, Secrets and the adapter's own notice and token volumes, no privilege, no root, no
``NVIDIA_*`` environment. Pure: no client, no I/O."""

from __future__ import annotations

from typing import Any

from idlegpu.scheduler.adapters.kubernetes.errors import UnsafeManifestError
from idlegpu.scheduler.adapters.kubernetes.names import (
    ANN_CHECKPOINT_REQUEST,
    NOTICE_VOLUME,
    TOKEN_VOLUME,
)

_VOLUME_SOURCES = ("persistentVolumeClaim", "emptyDir", "configMap", "secret")
"""The only volume sources a research pod may have."""


def _own_notice_volume(volume: dict[str, Any]) -> bool:
    """The notice volume as the adapter builds it: the pod's own notice annotation only."""
    items = (volume.get("downwardAPI") or {}).get("items") or []
    return len(items) == 1 and items[0].get("fieldRef", {}).get("fieldPath") == (
        f"metadata.annotations['{ANN_CHECKPOINT_REQUEST}']")


def _own_token_volume(volume: dict[str, Any]) -> bool:
    """The token volume as the adapter builds it: one service-account token, no Secret or
    ConfigMap smuggled in beside it."""
    sources = (volume.get("projected") or {}).get("sources") or []
    return len(sources) == 1 and set(sources[0]) == {"serviceAccountToken"}


def check_pod_security(manifest: dict[str, Any]) -> None:
    """Raise ``UnsafeManifestError`` when a Job manifest asks for anything privileged: host
    namespaces, volumes other than persistentVolumeClaim, emptyDir, configMap and secret
    (hostPath above all), privileged containers, privilege escalation, added capabilities,
    running as root, ``NVIDIA_*`` environment variables (or an envFrom prefix making them) and
    bidirectional mount propagation. Applied to every manifest before it is sent."""
    name = manifest.get("metadata", {}).get("name", "?")
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {}) or {}
    problems: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"spec.template.spec.{key}")
    for i, volume in enumerate(pod.get("volumes") or []):
        # only claims, scratch space, ConfigMaps and Secrets: never hostPath, nor any other
        # source that reaches the node or storage outside the namespace's control
        allowed = set(_VOLUME_SOURCES)
        if volume.get("name") == NOTICE_VOLUME and _own_notice_volume(volume):
            allowed.add("downwardAPI")
        if volume.get("name") == TOKEN_VOLUME and _own_token_volume(volume):
            allowed.add("projected")
        for key in sorted(set(volume) - {"name", *allowed}):
            problems.append(f"spec.template.spec.volumes[{i}].{key}")
    pod_ctx = pod.get("securityContext") or {}
    if pod_ctx.get("runAsNonRoot") is not True:
        problems.append("spec.template.spec.securityContext.runAsNonRoot must be true")
    if pod_ctx.get("runAsUser") == 0:
        problems.append("spec.template.spec.securityContext.runAsUser=0")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(pod.get(kind) or []):
            where = f"spec.template.spec.{kind}[{i}].securityContext"
            ctx = container.get("securityContext") or {}
            if ctx.get("privileged"):
                problems.append(f"{where}.privileged")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}.allowPrivilegeEscalation must be false")
            if ctx.get("runAsUser") == 0:
                problems.append(f"{where}.runAsUser=0")
            caps = ctx.get("capabilities") or {}
            if caps.get("add"):
                problems.append(f"{where}.capabilities.add")
            if "ALL" not in (caps.get("drop") or []):
                problems.append(f"{where}.capabilities.drop must include ALL")
            for port in container.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"spec.template.spec.{kind}[{i}].ports.hostPort")
            # NVIDIA_VISIBLE_DEVICES=all (or any NVIDIA_* knob) would let the container runtime
            # hand the pod GPUs it was never allocated
            for j, var in enumerate(container.get("env") or []):
                if str(var.get("name", "")).upper().startswith("NVIDIA_"):
                    problems.append(f"spec.template.spec.{kind}[{i}].env[{j}].name="
                                    f"{var.get('name')}")
            for j, source in enumerate(container.get("envFrom") or []):
                if str(source.get("prefix", "")).upper().startswith("NVIDIA_"):
                    problems.append(f"spec.template.spec.{kind}[{i}].envFrom[{j}].prefix")
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("mountPropagation") == "Bidirectional":
                    problems.append(f"spec.template.spec.{kind}[{i}].volumeMounts[{j}]"
                                    ".mountPropagation=Bidirectional")
    if problems:
        raise UnsafeManifestError(
            f"Job {name} breaks the pod security rules: {', '.join(problems)}")
