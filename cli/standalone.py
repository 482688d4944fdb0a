"""``gms standalone``: embedded etcd + one nameserver + one broker (+ the web console) in the
foreground.

The supervisor owns the order: etcd first, then the nameserver (``--etcd`` pointing at it),
then the broker (``--nameserver``), then the console; stopping goes the other way, so the broker deregisters
while etcd is still up. Children run in their own process groups (a Ctrl-C in the terminal
reaches only this supervisor, which stops them in order) and get SIGKILL from the kernel if
the supervisor itself dies (`gms.die_with_parent`), so nothing outlives it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from gms.address import join_address
from gms.broker.rocketmq import ROCKETMQ_EXTRA, stubs_installed
from gms.broker.store.layout import read_layout
from gms.broker.store.paths import StorePaths
from gms.cli import standalone_ports as ports
from gms.cli.standalone_security import prepare_secure, secured_before
from gms.cluster.errors import ClusterError
from gms.die_with_parent import dying_with_parent
from gms.nameserver.embedded_etcd import EmbeddedEtcd, etcd_hosts
from gms.private_files import make_private_dir, open_private, tighten_tree

DEFAULT_DATA_DIR = Path("gms-data")
CHILD_START_TIMEOUT_S = 30.0
CHILD_STOP_TIMEOUT_S = 15.0  # the broker flushes and checkpoints; well within this
# A new store's commitlog file size unless --commitlog-file-size says otherwise: a standalone is
# for trying things out; its files take disk as they fill anyway, and retention goes file by file.
COMMITLOG_FILE_SIZE_BYTES = 128 << 20
SUPERVISE_POLL_S = 0.2  # how soon an unexpected child exit is noticed
LOG_TAIL_BYTES = 2000


class StandaloneError(Exception):
    """A part of the standalone cluster failed to start; the message says which and why."""


class _Child:
    """One server child process (``python -m gms.<module>``) that reports its port in a file."""

    def __init__(self, name: str, module: str, args: list[str], run_dir: Path,
                 env: dict[str, str] | None = None, metrics_listen: str = "") -> None:
        """``env``: variables added to this process's for the child (secrets: never in argv).
        ``metrics_listen``: where the child serves /metrics (its port: :meth:`wait_metrics_port`)."""
        self.name = name
        self.log_path = run_dir / f"{name}.log"
        self.port_file = run_dir / f"{name}.port"
        self.port_file.unlink(missing_ok=True)
        self.metrics_port_file = run_dir / f"{name}.metrics-port"
        self.metrics_port_file.unlink(missing_ok=True)
        if metrics_listen:
            args = [*args, "--metrics-listen", metrics_listen, "--metrics-port-file", str(self.metrics_port_file)]
        with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            self.proc = subprocess.Popen(
                dying_with_parent([sys.executable, "-P", "-m", module, *args, "--port-file", str(self.port_file)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                close_fds=True,
                env={**os.environ, **env} if env else None,
            )

    def wait_port(self, timeout_s: float) -> int:
        return self.wait_port_file(self.port_file, timeout_s)

    def wait_metrics_port(self, timeout_s: float) -> int:
        return self.wait_port_file(self.metrics_port_file, timeout_s)

    def wait_port_file(self, port_file: Path, timeout_s: float) -> int:
        """The port the child writes to ``port_file`` once it serves there."""
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise StandaloneError(
                    f"{self.name} exited with code {self.proc.returncode} during start-up;"
                    f" its log ({self.log_path}) ends with:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise StandaloneError(
                    f"{self.name} did not start within {timeout_s} s; see {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)
        return int(port_file.read_text())

    def log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        except OSError as err:
            return f"(no log: {err})"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def stop(self, timeout_s: float = CHILD_STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@dataclasses.dataclass(frozen=True)
class StandaloneOptions:
    """What ``gms standalone`` runs (its flags). Port 0 picks a free port. The web console runs
    unless ``console_port`` is None (read-only unless ``console_admin``); the broker serves the
    RocketMQ 5 gRPC API on ``rocketmq_port`` when the ``rocketmq`` extra is installed, unless it is
    None or ``secure`` (without the extra, ``rocketmq_asked`` -- the port was given -- makes that an
    error), and the Kafka API on ``kafka_port`` unless it is None (with ``secure``: TLS and SASL,
    docs/kafka-compat.md). ``secure``: TLS with a development CA, authentication and ACLs, an
    ``admin`` super user (see :mod:`gms.cli.standalone_security`)."""

    data_dir: Path = DEFAULT_DATA_DIR
    nameserver_port: int = ports.NAMESERVER_PORT
    broker_port: int = ports.BROKER_PORT
    host: str = "127.0.0.1"
    etcd_port: int = 0
    nameserver_metrics_port: int = ports.NAMESERVER_METRICS_PORT
    broker_metrics_port: int = ports.BROKER_METRICS_PORT
    console_port: int | None = ports.CONSOLE_PORT
    console_admin: bool = False
    rocketmq_port: int | None = ports.ROCKETMQ_PORT
    rocketmq_asked: bool = False
    kafka_port: int | None = ports.KAFKA_PORT
    log_level: str = "info"
    log_format: str = "text"
    commitlog_file_size_bytes: int | None = None
    secure: bool = False

    def fixed_ports(self, rocketmq_off: str) -> dict[str, int | None]:
        """Each port by the flag that sets it (None: not served)."""
        return {"--nameserver-port": self.nameserver_port, "--broker-port": self.broker_port,
                "--etcd-port": self.etcd_port, "--nameserver-metrics-port": self.nameserver_metrics_port,
                "--broker-metrics-port": self.broker_metrics_port, "--console-port": self.console_port,
                "--rocketmq-port": None if rocketmq_off else self.rocketmq_port, "--kafka-port": self.kafka_port}


def run_standalone(options: StandaloneOptions, echo: Callable[[str], None] = print) -> int:
    """Run the parts until SIGINT/SIGTERM (a second one kills at once); return the exit
    code: 0 after a clean stop, 1 if a part failed to start or died. Call from the main thread
    (it installs signal handlers and the children's death signal follows the calling thread).
    Children's logs go to ``<data_dir>/logs/``. Both servers serve /metrics, /healthz and
    /readyz on their metrics ports."""
    data_dir = Path(options.data_dir).resolve()
    if not options.secure and secured_before(data_dir):
        echo(f"gms standalone: the data dir {data_dir} is secured (it was started with --secure, and its etcd has"
             " authentication on since): add --secure")
        return 1
    stop = threading.Event()
    parts = _Parts(options, data_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            parts.kill()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        echo(parts.start())
        code = _supervise(parts.children, stop, echo)
    except (StandaloneError, ClusterError) as err:
        echo(f"gms standalone: {err}")
        code = 1
    finally:
        if not parts.stop():
            code = 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        echo("gms standalone stopped")
    return code


class _Parts:
    """The standalone cluster's processes: embedded etcd, then the nameserver, the broker and the
    console as children (started in that order, stopped in the other)."""

    def __init__(self, options: StandaloneOptions, data_dir: Path) -> None:
        self.options = options
        self.data_dir = data_dir
        self.run_dir = data_dir / "logs"  # audit lines name users and their addresses: private, like the stores
        make_private_dir(self.run_dir)
        tighten_tree(self.run_dir)
        self.children: list[_Child] = []
        self.secured = prepare_secure(data_dir, options.host) if options.secure else None
        etcd_host, etcd_advertise_host = etcd_hosts(options.host)
        self.etcd = EmbeddedEtcd(data_dir / "etcd", client_port=options.etcd_port, host=etcd_host,
                                 advertise_host=etcd_advertise_host,
                                 tls=self.secured.etcd_tls if self.secured else None,
                                 auth=self.secured.etcd_auth if self.secured else None)

    def start(self) -> str:
        """Start every part; the banner saying where each serves."""
        options, secured = self.options, self.secured
        store_args = _store_args(self.data_dir, options.commitlog_file_size_bytes)
        rocketmq_off = _rocketmq_off(options.rocketmq_port, options.secure, options.rocketmq_asked)
        _check_ports_free(options.host, options.fixed_ports(rocketmq_off))
        self.etcd.start()
        if secured is not None:
            secured.create_users(self.etcd)
        nameserver = self._start_nameserver()
        nameserver_address = f"{options.host}:{nameserver.wait_port(CHILD_START_TIMEOUT_S)}"
        lines = [f"  nameserver  {nameserver_address}",
                 *self._start_broker(nameserver, nameserver_address, store_args, rocketmq_off)]
        if options.console_port is not None:
            lines.append(self._start_console(nameserver_address))
        lines += [f"  etcd        {self.etcd.endpoint}", f"  data        {self.data_dir}  (logs in {self.run_dir})"]
        return ("gms standalone is running (Ctrl-C stops it)\n" + "\n".join(lines)
                + (f"\n{secured.describe()}" if secured else ""))

    def _server_args(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """Arguments both servers take; the nameserver's and the broker's environment."""
        security_args, nameserver_env, broker_env = self.secured.server_args() if self.secured else ([], {}, {})
        return ["--log-level", self.options.log_level, "--log-format", self.options.log_format,
                *security_args], nameserver_env, broker_env

    def _start_nameserver(self) -> _Child:
        host = self.options.host
        args, env, _ = self._server_args()
        return self._child(
            "nameserver", "gms.nameserver",
            ["--listen", f"{host}:{self.options.nameserver_port}", "--etcd", self.etcd.endpoint,
             "--data-dir", str(self.data_dir / "nameserver"), *args],
            env, metrics_listen=f"{host}:{self.options.nameserver_metrics_port}")

    def _start_broker(self, nameserver: _Child, nameserver_address: str, store_args: list[str],
                      rocketmq_off: str) -> list[str]:
        """The broker's banner lines: its address, both servers' metrics, the RocketMQ and Kafka APIs."""
        options, host = self.options, self.options.host
        rocketmq_port_file = self.run_dir / "broker.rocketmq-port"
        kafka_port_file = self.run_dir / "broker.kafka-port"
        rocketmq_port_file.unlink(missing_ok=True)
        kafka_port_file.unlink(missing_ok=True)
        api_args = [] if rocketmq_off else ["--rocketmq-listen", f"{host}:{options.rocketmq_port}",
                                            "--rocketmq-port-file", str(rocketmq_port_file)]
        if options.kafka_port is not None:
            api_args += ["--kafka-listen", f"{host}:{options.kafka_port}", "--kafka-port-file", str(kafka_port_file)]
        args, _, env = self._server_args()
        broker = self._child(
            "broker", "gms.broker",
            ["--listen", f"{host}:{options.broker_port}", "--store-dir", str(self.data_dir / "broker"),
             "--nameserver", nameserver_address, *args, *store_args, *api_args],
            env, metrics_listen=f"{host}:{options.broker_metrics_port}")
        metrics = [f"http://{host}:{child.wait_metrics_port(CHILD_START_TIMEOUT_S)}/metrics ({child.name})"
                   for child in (nameserver, broker)]
        lines = [f"  broker      {host}:{broker.wait_port(CHILD_START_TIMEOUT_S)}",
                 f"  metrics     {', '.join(metrics)}; /healthz and /readyz beside them"]
        if rocketmq_off:
            lines.append(f"  rocketmq    {rocketmq_off}")
        else:
            rocketmq_bound = broker.wait_port_file(rocketmq_port_file, CHILD_START_TIMEOUT_S)
            lines.append(f"  rocketmq    {host}:{rocketmq_bound}  (for RocketMQ 5 clients: docs/rocketmq-compat.md)")
        if options.kafka_port is None:
            lines.append("  kafka       not served (--no-kafka)")
        else:
            kafka_bound = broker.wait_port_file(kafka_port_file, CHILD_START_TIMEOUT_S)
            how = "SASL_SSL with SCRAM-SHA-256 or PLAIN" if options.secure else "for Kafka clients"
            lines.append(f"  kafka       {host}:{kafka_bound}  ({how}: docs/kafka-compat.md)")
        return lines

    def _start_console(self, nameserver_address: str) -> str:
        options = self.options
        console = self._child(
            "console", "gms.console",
            ["--nameserver", nameserver_address, "--listen", f"{options.host}:{options.console_port}",
             *(["--admin"] if options.console_admin else ["--admin-how", "gms standalone --console-admin"])],
            self.secured.client_env() if self.secured else None)
        return (f"  console     http://{options.host}:{console.wait_port(CHILD_START_TIMEOUT_S)}/"
                + ("" if options.console_admin else "  (read-only; --console-admin for admin actions)"))

    def _child(self, name: str, module: str, args: list[str], env: dict[str, str] | None,
               metrics_listen: str = "") -> _Child:
        child = _Child(name, module, args, self.run_dir, env, metrics_listen=metrics_listen)
        self.children.append(child)
        return child

    def kill(self) -> None:
        for child in self.children:
            child.kill()

    def stop(self) -> bool:
        """Stop the children, the console first and the broker before the nameserver (it
        deregisters while etcd is up), then etcd; False if a child did not exit cleanly."""
        clean = True
        for child in reversed(self.children):
            if child.stop() != 0:
                clean = False
        self.etcd.stop()
        return clean


def _rocketmq_off(rocketmq_port: int | None, secure: bool, rocketmq_asked: bool) -> str:
    """Why the broker does not serve the RocketMQ API, for the banner ("": it does). The API
    asked for by name and not installed is an error, not a note."""
    if rocketmq_port is None:
        return "not served (--no-rocketmq)"
    if secure:
        return "not served: the RocketMQ API has no authentication yet (docs/rocketmq-compat.md)"
    if not stubs_installed():
        if rocketmq_asked:
            raise StandaloneError(f"--rocketmq-port {rocketmq_port}: serving the RocketMQ 5 API needs"
                                  f" {ROCKETMQ_EXTRA}; or start without --rocketmq-port")
        return f"not served: it needs {ROCKETMQ_EXTRA}"
    return ""


def _check_ports_free(host: str, ports: dict[str, int | None]) -> None:
    """Each fixed port asked for is free now, else a StandaloneError naming this command's flag for
    it (a server that cannot listen names its own flags, --listen and --metrics-listen, which
    `gms standalone` does not take) before anything is started."""
    for flag, port in ports.items():
        if not port:
            continue  # none, or any free one
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
                probe.bind(address)
        except OSError as err:
            raise StandaloneError(
                f"cannot listen on {join_address(host, port)} ({err.strerror}; is another gms standalone"
                f" running?): stop what holds it, or pick another port with {flag} (0 picks a free one)") from err


def _store_args(data_dir: Path, commitlog_file_size_bytes: int | None) -> list[str]:
    """The broker's store geometry: the one an existing store was created with (so a restart
    needs no flags), else ``--commitlog-file-size`` or COMMITLOG_FILE_SIZE_BYTES."""
    layout = read_layout(StorePaths.of_broker(data_dir / "broker").layout)
    if layout is None:
        return ["--commitlog-file-size", str(commitlog_file_size_bytes or COMMITLOG_FILE_SIZE_BYTES)]
    stored_size = layout["commitlog_file_size_bytes"]
    if commitlog_file_size_bytes and commitlog_file_size_bytes != stored_size:
        raise StandaloneError(
            f"the broker store in {data_dir / 'broker'} was created with --commitlog-file-size {stored_size},"
            f" not {commitlog_file_size_bytes}; the size cannot change under existing data. Leave out"
            " --commitlog-file-size (the stored size is used) or start with another --data-dir"
        )
    return ["--commitlog-file-size", str(stored_size), "--cq-file-entries", str(layout["cq_entries_per_file"])]


def _supervise(children: list[_Child], stop: threading.Event, echo: Callable[[str], None]) -> int:
    """Wait for a stop signal; a child that exits on its own ends the run with code 1."""
    while not stop.wait(SUPERVISE_POLL_S):
        for child in children:
            if child.proc.poll() is not None:
                echo(
                    f"gms standalone: {child.name} exited with code {child.proc.returncode};"
                    f" stopping the rest. Its log ({child.log_path}) ends with:\n{child.log_tail()}"
                )
                return 1
    return 0
