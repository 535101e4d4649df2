"""A REAL Kueue controller manager for tests, against the real control plane of
``kube_control_plane.ControlPlane``.

    kueue = KueueManager(control_plane, workdir).start()   # CRDs, namespace, certificates
    kueue.apply(manifest_dict)                              # server-side apply as the admin
    kueue.stop()

The binary (``kueue-manager``, Kueue's ``cmd/kueue`` of the v0.13 line, API
``kueue.x-k8s.io/v1beta1``) and its CRDs come from ``../shared/kueue``: ``install.sh`` unpacks the
binary beside the control plane's (``.cache/k8s/bin``, or ``KUBEBUILDER_ASSETS``) and
scripts/test.sh copies the CRDs to ``.cache/kueue/crds``; ``KUEUE_CRDS`` names another directory.
Facts of how it runs here (``../shared/kueue/README.md``): the CRDs go in with server-side apply
(plain apply fails on their size), the namespace of its config must exist, its webhook and
metrics servers want a certificate pair (self-signed will do; the metrics one is read from
``KUEUE_METRICS_CERT_DIR``), the visibility API server is switched off (it needs in-cluster
authentication), and no webhook configuration is installed, so nothing suspends a Job for you:
tests create Jobs with ``spec.suspend: true`` and the label ``kueue.x-k8s.io/queue-name``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from kube_control_plane import (
    DEFAULT_ASSETS,
    REPO,
    ControlPlane,
    _die_with_parent,
    _tail,
    free_port,
)

KUEUE_NAMESPACE = "kueue-system"
DEFAULT_CRDS = REPO / ".cache" / "kueue" / "crds"
INSTALL_HINT = (
    "run `../shared/kueue/install.sh .cache/k8s/bin` and copy `../shared/kueue/crds` to "
    "`.cache/kueue/crds` (scripts/test.sh does both)"
)


class KueueMissingError(RuntimeError):
    """The Kueue binary or its CRDs are not installed."""


def find_kueue() -> tuple[Path, Path]:
    """The ``kueue-manager`` binary and the CRD directory, or KueueMissingError saying how."""
    assets = Path(os.environ.get("KUBEBUILDER_ASSETS") or DEFAULT_ASSETS)
    binary = assets / "kueue-manager"
    crds = Path(os.environ.get("KUEUE_CRDS") or DEFAULT_CRDS)
    if not os.access(binary, os.X_OK):
        raise KueueMissingError(f"no Kueue controller manager at {binary}: {INSTALL_HINT}")
    if not any(crds.glob("kueue.x-k8s.io_*.yaml")):
        raise KueueMissingError(f"no Kueue CRDs in {crds}: {INSTALL_HINT}")
    return binary, crds


class KueueManager:
    """Kueue's controller manager for ``plane``, started by ``start()``, logging to
    ``<workdir>/kueue.log``."""

    def __init__(self, plane: ControlPlane, workdir: str | os.PathLike[str], *,
                 ready_timeout: float = 90.0) -> None:
        self.plane = plane
        self.workdir = Path(workdir).resolve()
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = 0
        self.startup_seconds: float | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "kueue.log"

    def start(self) -> Self:
        began = time.monotonic()
        binary, crds = find_kueue()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        deadline = time.monotonic() + self.ready_timeout
        for crd in ("workloads", "clusterqueues", "localqueues", "admissionchecks",
                    "resourceflavors"):
            # (`kubectl wait` fails at once while a new CRD has no conditions yet)
            while not self._established(f"{crd}.kueue.x-k8s.io"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {crd}.kueue.x-k8s.io not Established in time")
                time.sleep(0.2)
        if self.plane.kubectl("get", "namespace", KUEUE_NAMESPACE, "--ignore-not-found",
                              "-o", "name").stdout.strip() == "":
            self.plane.kubectl("create", "namespace", KUEUE_NAMESPACE)
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.crt")],
            check=True, capture_output=True)
        self.health_port = free_port()
        config = self.workdir / "config.yaml"
        config.write_text(json.dumps({  # JSON is YAML
            "apiVersion": "config.kueue.x-k8s.io/v1beta1",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
            "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},
        }))
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(binary), "--config", str(config), "--kubeconfig", self.plane.kubeconfig,
             "--feature-gates=VisibilityOnDemand=false"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            env={**os.environ, "KUEUE_METRICS_CERT_DIR": str(certs)})
        log.close()
        deadline = time.monotonic() + self.ready_timeout
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"kueue-manager exited ({self.proc.returncode}):\n"
                                   + _tail(self.log_path))
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("kueue-manager not ready in time:\n" + _tail(self.log_path))
            time.sleep(0.25)
        self.startup_seconds = time.monotonic() - began
        return self

    def _established(self, crd: str) -> bool:
        found = json.loads(self.plane.kubectl("get", "crd", crd, "-o", "json").stdout)
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in found.get("status", {}).get("conditions") or [])

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz",
                                        timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def apply(self, manifest: dict[str, Any], *, manager: str = "idlegpu-tests",
              subresource: str | None = None, force: bool = False) -> None:
        """Server-side apply of one object as the admin (``kubectl apply --server-side``), of
        its ``subresource`` (e.g. ``status``) when given, under the field manager
        ``manager``; ``force`` takes over fields another manager set (Kueue itself writes
        each check's first ``Pending`` entry, so a check's controller must force its own)."""
        args = ["apply", "--server-side", f"--field-manager={manager}", "-f", "-"]
        if subresource:
            args.append(f"--subresource={subresource}")
        if force:
            args.append("--force-conflicts")
        self.plane.kubectl(*args, input=json.dumps(manifest))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        args = ["get", kind, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        return json.loads(self.plane.kubectl(*args).stdout)
