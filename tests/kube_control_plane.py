"""A REAL Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler on free loopback ports, with their own certificates and data directory.

    with ControlPlane(workdir) as cp:            # or ControlPlane(workdir).start() ... .stop()
        cp.kubeconfig                            # admin (O=system:masters) kubeconfig path
        cp.kubeconfig_for("nobody")              # an unprivileged user (CN=nobody), for RBAC denials
        with cp.api_client() as api: ...         # kubernetes.client.ApiClient, admin
        cp.kubectl("get", "jobs", "-n", ns)      # CompletedProcess (text); raises on failure
        cp.create_namespace("research")          # waits for its ServiceAccount `default`

The binaries are found through ``KUBEBUILDER_ASSETS`` (the controller-runtime envtest convention:
a directory holding ``kube-apiserver``, ``etcd`` and ``kubectl``; this module also needs
``kube-controller-manager`` and ``kube-scheduler``, which envtest assets do not have). Without the
variable, ``.cache/k8s/bin`` of the checkout is used when it exists, and ``etcd`` falls back to the
one on PATH (Debian's ``etcd-server``). ``../shared/k8s/install.sh .cache/k8s/bin`` unpacks the
real 1.36 binaries there. Certificates are made with the ``openssl`` command.

There is no kubelet: ``tests/node_sim.py`` plays one. The controller-manager runs every default
controller (``--controllers=*``) with per-controller ServiceAccount credentials, and short node
monitoring periods so a node that stops heartbeating turns NotReady within about 20 s.

Each process logs to ``<workdir>/<name>.log``; when start-up fails the error shows the tail of
every log. ``stop()`` terminates (then kills) exactly the processes ``start()`` started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ASSETS = REPO / ".cache" / "k8s" / "bin"

CONTROL_PLANE_PARTS = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
)
INSTALL_HINT = (
    "run `../shared/k8s/install.sh .cache/k8s/bin` then set `KUBEBUILDER_ASSETS=.cache/k8s/bin` "
    "(scripts/test.sh does both; etcd comes from Debian's etcd-server)"
)

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# controller-manager settings that keep tests fast: a node that stops heartbeating is marked
# unhealthy after NODE_MONITOR_GRACE (default 50 s), checked every NODE_MONITOR_PERIOD
NODE_MONITOR_GRACE = "20s"
NODE_MONITOR_PERIOD = "2s"
# the terminated-pod garbage collector starts deleting finished pods past this count
TERMINATED_POD_GC_THRESHOLD = 100

USERS = {  # kubeconfig user -> certificate subject
    "admin": "/O=system:masters/CN=admin",
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
    "nobody": "/CN=nobody",
}

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, \
DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, IP:10.0.0.1
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""


class KubeBinariesMissingError(RuntimeError):
    """Some control-plane binaries (or openssl) are not available."""


class ControlPlaneError(RuntimeError):
    """The control plane did not start (the message holds the tails of the process logs)."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; the message holds its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


def find_binaries(assets: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Paths of every part in ``CONTROL_PLANE_PARTS``, from ``assets`` (default:
    ``$KUBEBUILDER_ASSETS``, else ``.cache/k8s/bin`` of the checkout); ``etcd`` may also come
    from PATH. Raise ``KubeBinariesMissingError`` naming what is missing."""
    source = "argument"
    if assets is None:
        env = os.environ.get("KUBEBUILDER_ASSETS")
        if env:
            assets, source = env, "KUBEBUILDER_ASSETS"
        elif DEFAULT_ASSETS.is_dir():
            assets, source = DEFAULT_ASSETS, "default"
    if assets is None:
        raise KubeBinariesMissingError(
            f"KUBEBUILDER_ASSETS is not set and {DEFAULT_ASSETS} does not exist; {INSTALL_HINT}"
        )
    folder = Path(assets).absolute()
    found: dict[str, str] = {}
    missing: list[str] = []
    for part in CONTROL_PLANE_PARTS:
        path = folder / part
        if path.is_file() and os.access(path, os.X_OK):
            found[part] = str(path)
        elif part == "etcd" and shutil.which("etcd"):
            found[part] = shutil.which("etcd")  # type: ignore[assignment]
        else:
            missing.append(part)
    if not shutil.which("openssl"):
        missing.append("openssl (on PATH)")
    if missing:
        where = f"{folder} ({'KUBEBUILDER_ASSETS' if source == 'KUBEBUILDER_ASSETS' else source})"
        raise KubeBinariesMissingError(
            f"{where} lacks {', '.join(missing)} (have: {', '.join(found) or 'nothing'}; "
            "envtest assets hold only kube-apiserver, etcd and kubectl, and this fixture also "
            f"needs kube-controller-manager and kube-scheduler); {INSTALL_HINT}"
        )
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM if the test process dies without stopping it."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # best effort only
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: Path, chars: int = 2500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:] if text else "(empty log)"


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler, started by ``start()``."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        assets: str | os.PathLike[str] | None = None,
        ready_timeout: float = 90.0,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.assets = assets
        self.ready_timeout = ready_timeout
        self.bin: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, Any] = {}
        self.ports: dict[str, int] = {}
        self.certs = self.workdir / "pki"
        self.etcd_data: Path | None = None
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}  # seconds spent in each start-up wait

    # ---- addresses and credentials -------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> str:
        """The admin (``O=system:masters``) kubeconfig path."""
        return self.kubeconfig_for("admin")

    def kubeconfig_for(self, user: str) -> str:
        """Kubeconfig path of ``user``: admin, nobody, kube-controller-manager, kube-scheduler."""
        if user not in USERS:
            raise KeyError(f"no such user {user!r}; known: {', '.join(USERS)}")
        return str(self.workdir / f"{user}.kubeconfig")

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # ---- start / stop --------------------------------------------------------------------
    def start(self) -> Self:
        started = time.monotonic()
        self.bin = find_binaries(self.assets)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._make_certificates()
        last_error: Exception | None = None
        for _attempt in range(3):  # a probed free port can be taken before a process binds it
            self.ports = {
                name: free_port()
                for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
            }
            for user in USERS:
                self._write_kubeconfig(user)
            try:
                self._start_all()
            except BaseException as exc:
                if not isinstance(exc, ControlPlaneError):
                    self.stop()
                    raise
                last_error = exc
                logs = " ".join(_tail(self.log_path(n), 20000) for n in self.procs)
                self.stop()
                if "address already in use" in logs:
                    continue
                raise
            self.startup_seconds = time.monotonic() - started
            return self
        raise last_error  # type: ignore[misc]

    def _start_all(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        self._start_etcd()
        self._start_apiserver()
        self._wait("kube-apiserver /readyz", deadline, self._apiserver_ready)
        # both clients read the apiserver's extension-apiserver-authentication ConfigMap at
        # start-up, so they start once it is ready
        self._start_controller_manager()
        self._start_scheduler()
        self._wait("kube-scheduler /healthz", deadline, lambda: self._healthz("scheduler"))
        self._wait(
            "ServiceAccount default/default (made by the controller-manager)",
            deadline,
            lambda: self._get(
                "/api/v1/namespaces/default/serviceaccounts/default", quiet=True
            ) is not None,
        )

    def stop(self) -> None:
        """Terminate (then kill) exactly the processes this object started, clients first."""
        for group in (("kube-scheduler", "kube-controller-manager"), ("kube-apiserver",), ("etcd",)):
            procs = [self.procs.pop(name) for name in group if name in self.procs]
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def __enter__(self) -> Self:
        if not self.procs:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.log_path(name), "ab")  # noqa: SIM115 - closed in stop()
        log.write(f"---- {' '.join(args)}\n".encode())
        log.flush()
        self._logs[name] = log
        self.procs[name] = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )

    def _start_etcd(self) -> None:
        # a fresh data directory per start (measured: a tmpfs one starts no faster)
        self.etcd_data = self.workdir / "etcd"
        shutil.rmtree(self.etcd_data, ignore_errors=True)
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn("etcd", [
            self.bin["etcd"],
            "--name=default",
            f"--data-dir={self.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            "--log-level=warn",
            "--logger=zap",
        ])

    def _start_apiserver(self) -> None:
        pki = self.certs
        self._spawn("kube-apiserver", [
            self.bin["kube-apiserver"],
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
            "--v=1",
        ])

    def _start_controller_manager(self) -> None:
        pki = self.certs
        kubeconfig = self.kubeconfig_for("kube-controller-manager")
        self._spawn("kube-controller-manager", [
            self.bin["kube-controller-manager"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['controller-manager']}",
            f"--cert-dir={self.workdir / 'controller-manager-certs'}",
            "--controllers=*",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            f"--node-monitor-period={NODE_MONITOR_PERIOD}",
            "--node-startup-grace-period=30s",
            f"--terminated-pod-gc-threshold={TERMINATED_POD_GC_THRESHOLD}",
            "--concurrent-job-syncs=5",
            "--profiling=false",
            "--v=1",
        ])

    def _start_scheduler(self) -> None:
        kubeconfig = self.kubeconfig_for("kube-scheduler")
        self._spawn("kube-scheduler", [
            self.bin["kube-scheduler"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['scheduler']}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ])

    def _wait(self, what: str, deadline: float, ready: Any) -> None:
        begun = time.monotonic()
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {proc.returncode} while waiting for {what}"
                        f"\n{self._log_tails()}"
                    )
            if ready():
                self.timings[what] = round(time.monotonic() - begun, 2)
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {self.ready_timeout:.0f} s waiting for {what}"
                    f"\n{self._log_tails()}"
                )
            time.sleep(0.1)

    def _log_tails(self) -> str:
        parts = []
        for name in self.procs:
            parts.append(f"---- {name} ({self.log_path(name)}), last lines:\n"
                         f"{_tail(self.log_path(name))}")
        return "\n".join(parts)

    # ---- HTTP to the apiserver (admin) ---------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        ctx.load_cert_chain(str(self.certs / "admin.crt"), str(self.certs / "admin.key"))
        return ctx

    def _get(self, path: str, *, quiet: bool = False) -> Any:
        """GET ``path`` as admin: the decoded JSON (or text), None on 404 / connection errors
        when ``quiet``."""
        try:
            with urllib.request.urlopen(
                self.url + path, context=self._ssl_context(), timeout=5
            ) as resp:
                body = resp.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            if quiet:
                return None
            raise
        try:
            return json.loads(body)
        except ValueError:
            return body

    def _apiserver_ready(self) -> bool:
        return self._get("/readyz", quiet=True) == "ok"

    def _healthz(self, component: str) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the component's self-signed serving certificate
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.ports[component]}/healthz", context=ctx, timeout=2
            ) as resp:
                return resp.read().decode() == "ok"
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    # ---- certificates and kubeconfigs ----------------------------------------------------
    def _openssl(self, *args: str) -> None:
        proc = subprocess.run(
            ["openssl", *args], cwd=self.certs, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stderr[-2000:]}")

    def _make_certificates(self) -> None:
        if (self.certs / "done").exists():
            return
        self.certs.mkdir(parents=True, exist_ok=True)
        (self.certs / "openssl.cnf").write_text(_OPENSSL_CONFIG)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl(
            "req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", *ec,
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
            "-subj", "/CN=idlegpu-test-ca",
        )
        leaves = [("apiserver", "/CN=kube-apiserver", "server")]
        leaves += [(user, subject, "client") for user, subject in USERS.items()]

        def leaf(name: str, subject: str, kind: str) -> None:
            self._openssl(
                "req", "-new", "-config", "openssl.cnf", *ec,
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
            )
            self._openssl(
                "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "365",
                "-extfile", "openssl.cnf", "-extensions", kind, "-out", f"{name}.crt",
            )

        def service_account_keys() -> None:
            self._openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                          "-out", "sa.key")
            self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")

        with ThreadPoolExecutor(max_workers=3) as pool:
            jobs = [pool.submit(leaf, *spec) for spec in leaves]
            jobs.append(pool.submit(service_account_keys))
            for job in jobs:
                job.result()
        (self.certs / "done").write_text("")

    def _write_kubeconfig(self, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "idlegpu-test", "cluster": {
                "server": self.url, "certificate-authority": str(self.certs / "ca.crt"),
            }}],
            "users": [{"name": user, "user": {
                "client-certificate": str(self.certs / f"{user}.crt"),
                "client-key": str(self.certs / f"{user}.key"),
            }}],
            "contexts": [{"name": user, "context": {
                "cluster": "idlegpu-test", "user": user, "namespace": "default",
            }}],
            "current-context": user,
        }
        Path(self.kubeconfig_for(user)).write_text(json.dumps(config, indent=1))

    # ---- helpers for tests ---------------------------------------------------------------
    def api_client(self, user: str = "admin") -> Any:
        """A new ``kubernetes.client.ApiClient`` for ``user`` (close it, or use ``with``)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig_for(user))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        user: str = "admin",
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig <user's> ARGS``; raise with its output when it fails and
        ``check``."""
        proc = subprocess.run(
            [self.bin["kubectl"], f"--kubeconfig={self.kubeconfig_for(user)}", *args],
            input=input, capture_output=True, text=True, check=False, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, proc.args, output=proc.stdout, stderr=proc.stderr)
        return proc

    def create_namespace(
        self, name: str, *, labels: dict[str, str] | None = None, timeout: float = 30
    ) -> str:
        """Create Namespace ``name`` and wait for its ServiceAccount ``default`` (pods cannot
        be created before it exists); return the name."""
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespace(
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": name, "labels": labels or {}}}
            )
        deadline = time.monotonic() + timeout
        while self._get(f"/api/v1/namespaces/{name}/serviceaccounts/default", quiet=True) is None:
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"ServiceAccount {name}/default did not appear")
            time.sleep(0.05)
        return name

    def delete_namespace(self, name: str) -> None:
        """Ask for deletion of Namespace ``name`` (background; does not wait)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.api_client() as api:
            try:
                client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
