"""A broker whose store is on a genuinely small filesystem that fills up (issue 11, part 6).

The store's ``disk_full`` health flag is unit-tested by injecting ENOSPC; here a real broker
process runs on a tiny tmpfs: a filler file takes most of it, the producer sends until the store
cannot create its next file, and then every acknowledged message must still be there — while the
disk is full, after a SIGKILL and a restart on the full disk, after the filler is deleted (sends
work again, the flag clears) and after another SIGKILL.

Mounting needs privileges CI may lack, so the filesystem comes from the first way that works:
a private mount namespace of an unprivileged user namespace (``unshare --user --map-root-user
--mount``), a private mount namespace (root), a tmpfs in this one (root), a loop-mounted ext4
image (root); the test skips, naming what it tried, when none does. A long-lived ``sleep`` holds
the namespace (a tmpfs in it would vanish with its last process); brokers are started in it
with ``nsenter`` and this process reaches the files through ``/proc/<holder>/root``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from processes import alive, wait_until

from gms.client import Admin, Consumer, Producer, ProducerRecord
from gms.errors import GmsError

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux mounts")]

MIB = 1 << 20
FS_SIZE_BYTES = 10 * MIB
COMMITLOG_FILE_BYTES = MIB
TOPIC = "diskfull"
BATCH = 25


class Layout(NamedTuple):
    """How full disk is reached: which kind of store file is the first one refused."""

    refused: str  # the directory of the file whose creation gets ENOSPC
    store_room_bytes: int  # left free by the filler
    cq_file_entries: int
    body_bytes: int


LAYOUTS = [
    # 1 KiB messages: the commitlog's fourth file finds no room (80 KiB consumeQueue files fit).
    Layout("commitlog", 4 * MIB + 256 * 1024, 4096, 1000),
    # 100-byte messages and 5 KiB consumeQueue files: room for the commitlog's first file (its
    # spare comes once it is half full), then a few consumeQueue files; the first commitlog file
    # is far from half full when the next consumeQueue file cannot be created.
    Layout("consumequeue", MIB + 48 * 1024, 256, 100),
]
START_TIMEOUT_S = 20.0
FAILED_SEND_MAX_S = 10.0  # a send the full disk refuses fails this fast (retries included): no hang
CONSUME_TIMEOUT_S = 60.0
CHECKPOINT_INTERVAL_S = 1.0  # the store's default


# --- a small filesystem ----------------------------------------------------------------------


class SmallFs:
    """A small filesystem mounted at ``mount_dir`` for commands run through :meth:`command`;
    ``path`` is where this process reaches it (the same directory, or through the namespace
    holder's ``/proc/<pid>/root``)."""

    def __init__(self, how: str, mount_dir: Path, path: Path, prefix: list[str],
                 cleanup: Callable[[], None]) -> None:
        self.how = how
        self.mount_dir = mount_dir
        self.path = path
        self.prefix = prefix
        self._cleanup = cleanup

    def command(self, cmd: list[str]) -> list[str]:
        return [*self.prefix, *cmd]

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        self._cleanup()


def _holder(cmd: list[str], mount_dir: Path, ready: Path, errors: Path) -> subprocess.Popen:
    """Start ``cmd`` (an ``unshare``) that mounts a tmpfs on ``mount_dir`` in its new mount
    namespace, touches ``ready`` and sleeps: the namespace lives as long as it does."""
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && : > "$3" && exec sleep 86400'
    with open(errors, "wb") as err:
        return subprocess.Popen([*cmd, "sh", "-c", script, "sh", str(FS_SIZE_BYTES), str(mount_dir), str(ready)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


def _namespace_fs(how: str, unshare: list[str], enter: list[str], mount_dir: Path) -> SmallFs:
    ready = mount_dir.parent / f"{mount_dir.name}.ready"
    errors = mount_dir.parent / f"{mount_dir.name}.unshare-errors"
    ready.unlink(missing_ok=True)
    holder = _holder(unshare, mount_dir, ready, errors)

    def stop() -> None:
        if holder.poll() is None:
            holder.kill()
        holder.wait()

    deadline = time.monotonic() + 10
    while not ready.exists():
        exited = holder.poll()
        if exited is not None or time.monotonic() > deadline:
            stop()
            said = " ".join(errors.read_text(errors="replace").split())
            raise OSError(said or (f"{unshare[0]} gave no answer in 10 s" if exited is None
                                   else f"{unshare[0]} exited with status {exited}"))
        time.sleep(0.01)
    fs = SmallFs(how, mount_dir, Path(f"/proc/{holder.pid}/root{mount_dir}"),
                 ["nsenter", f"--target={holder.pid}", *enter, "--"], stop)
    try:  # this process must see the namespace's files, and brokers must get in
        st = os.statvfs(fs.path)
        if st.f_blocks * st.f_frsize > 2 * FS_SIZE_BYTES:
            raise OSError(f"{fs.path} is not the small filesystem")
        entered = subprocess.run(fs.command(["true"]), capture_output=True, timeout=10, check=False)
        if entered.returncode != 0:
            raise OSError(f"nsenter: {entered.stderr.decode(errors='replace').strip()}")
    except (OSError, subprocess.SubprocessError) as err:
        stop()
        raise OSError(f"namespace made but not usable: {err}") from err
    return fs


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {done.stderr.decode(errors='replace').strip()}")


def _host_tmpfs(mount_dir: Path) -> SmallFs:
    _run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE_BYTES}", "tmpfs", str(mount_dir)])
    return SmallFs("tmpfs (mount as root)", mount_dir, mount_dir, [],
                   lambda: _run(["umount", "-l", str(mount_dir)]))


def _loop_ext4(mount_dir: Path) -> SmallFs:
    image = mount_dir.parent / "small.ext4"
    with open(image, "wb") as f:
        f.truncate(FS_SIZE_BYTES + 2 * MIB)  # room for the journal
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)])
    _run(["mount", "-o", "loop", str(image), str(mount_dir)])

    def cleanup() -> None:
        _run(["umount", "-l", str(mount_dir)])
        image.unlink(missing_ok=True)
    return SmallFs("loop-mounted ext4 image (root)", mount_dir, mount_dir, [], cleanup)


def mount_small_fs(mount_dir: Path) -> SmallFs:
    """The first way to mount a small filesystem that works here; skips the test if none does."""
    mount_dir.mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    ways: list[tuple[str, Callable[[], SmallFs]]] = []
    if not {"unshare", "nsenter"} & set(missing):
        ways.append(("tmpfs in an unprivileged user + mount namespace", lambda: _namespace_fs(
            "tmpfs in a user + mount namespace",
            ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"],
            ["--user", "--mount", "--preserve-credentials"], mount_dir)))
        if root:
            ways.append(("tmpfs in a private mount namespace (root)", lambda: _namespace_fs(
                "tmpfs in a private mount namespace",
                ["unshare", "--mount", "--propagation", "private"], ["--mount"], mount_dir)))
    if root and "mount" not in missing:
        ways.append(("tmpfs mounted as root", lambda: _host_tmpfs(mount_dir)))
        if shutil.which("mkfs.ext4"):
            ways.append(("loop-mounted ext4 image", lambda: _loop_ext4(mount_dir)))
    tried = []
    for name, way in ways:
        try:
            return way()
        except (OSError, subprocess.SubprocessError) as err:
            tried.append(f"{name}: {err}")
    if not root:
        tried.append("plain mount, loop-mounted ext4: not root")
    if missing:
        tried.append(f"not installed: {', '.join(missing)}")
    pytest.skip("no small filesystem can be mounted here (tried " + "; ".join(tried) + ")")


@pytest.fixture
def small_fs(tmp_path) -> Iterator[SmallFs]:
    fs = mount_small_fs(tmp_path / "fs")
    try:
        yield fs
    finally:
        fs.close()


# --- a broker on it --------------------------------------------------------------------------


class SmallFsBroker:
    """A broker child whose store is on the small filesystem (started through its namespace);
    its port file and log stay outside, on the test's own disk."""

    def __init__(self, fs: SmallFs, outside: Path, cq_file_entries: int) -> None:
        self.fs = fs
        self.cq_file_entries = cq_file_entries
        self.port_file = outside / "broker.port"
        self.log_path = outside / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SmallFsBroker:
        self.port_file.unlink(missing_ok=True)
        cmd = self.fs.command([
            sys.executable, "-P", "-m", "gms.broker", "--listen", f"127.0.0.1:{self.port}",
            "--store-dir", str(self.fs.mount_dir / "broker"), "--port-file", str(self.port_file),
            "--commitlog-file-size", str(COMMITLOG_FILE_BYTES), "--cq-file-entries", str(self.cq_file_entries),
            "--flush", "sync", "--no-auto-create-topics"])
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # a SIGBUS leaves a stack
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the broker did not start on the small filesystem ({self.fs.how}), exit status "
                            f"{self.proc.returncode}: {self.log_tail()}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())
        return self

    def crash_and_restart(self) -> None:
        self.kill()
        self.start()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and alive(self.proc.pid)

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def store_health(self) -> str:
        with Admin(brokers=self.address) as admin:
            [status] = admin.broker_status()
        assert "error" not in status, status
        return status["store_health"]


# --- the scenario ----------------------------------------------------------------------------


class Messages:
    """Numbered messages of one size to the topic's one queue, and the ones acknowledged
    (queue offset -> body)."""

    def __init__(self, broker: SmallFsBroker, body_bytes: int) -> None:
        self.broker = broker
        self.body_bytes = body_bytes
        self.acked: dict[int, bytes] = {}
        self.next = 0

    def bodies(self, count: int) -> list[bytes]:
        first, self.next = self.next, self.next + count
        return [(b"acked-%06d-" % i).ljust(self.body_bytes, b"x") for i in range(first, self.next)]

    def send(self, producer: Producer, count: int) -> None:
        bodies = self.bodies(count)
        results = producer.send_batch([ProducerRecord(TOPIC, b, queue=0) for b in bodies])
        self.acked.update((r.queue_offset, b) for r, b in zip(results, bodies, strict=True))

    def send_until_refused(self, batch: int) -> GmsError:
        """Send batches of ``batch`` messages until the store refuses one (fast: no hang)."""
        with Producer(brokers=self.broker.address, linger_ms=0, retries=1, retry_backoff_ms=50) as producer:
            while self.next < 1_000_000:
                started = time.monotonic()
                try:
                    self.send(producer, batch)
                except GmsError as err:
                    assert time.monotonic() - started < FAILED_SEND_MAX_S, "a refused send hung"
                    return err
        pytest.fail(f"the small filesystem never filled ({len(self.acked)} messages acknowledged)")

    def assert_refused(self, refused: str) -> None:
        """More sends, one and many at a time: each refused fast, naming the full disk and the
        file that found no room."""
        with Producer(brokers=self.broker.address, linger_ms=0, retries=0) as producer:
            for count in (BATCH, 1, BATCH):
                started = time.monotonic()
                with pytest.raises(GmsError, match="No space left on device") as err:
                    self.send(producer, count)
                assert f"/store/{refused}/" in str(err.value), err.value
                assert time.monotonic() - started < FAILED_SEND_MAX_S, "a refused send hung"

    def assert_all_readable(self) -> None:
        """Every acknowledged message is served, once, and nothing else: a refused send stored
        nothing."""
        got: dict[int, bytes] = {}
        with Consumer(brokers=self.broker.address, group=f"g{time.monotonic_ns()}", subscription={TOPIC: "*"},
                      start_from="first", auto_commit=False) as consumer:
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(got) < len(self.acked) and time.monotonic() < deadline:
                for m in consumer.poll(200):
                    assert m.queue_offset not in got, f"offset {m.queue_offset} served twice"
                    got[m.queue_offset] = m.body
        missing = sorted(set(self.acked) - set(got))
        assert not missing, f"{len(missing)} acknowledged messages lost, first offsets {missing[:5]}"
        assert got == self.acked
        assert sorted(self.acked) == list(range(len(self.acked)))  # no offset skipped or reused


def take_the_rest(small_fs, path: Path) -> None:
    """Allocate every byte still free to ``path`` (none may be left: fallocate of 0 fails)."""
    with open(path, "wb") as f:
        if small_fs.free_bytes():
            os.posix_fallocate(f.fileno(), 0, small_fs.free_bytes())


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.refused for layout in LAYOUTS])
def test_a_full_filesystem_refuses_sends_keeps_every_acked_message_and_recovers(small_fs, tmp_path, layout):
    filler = small_fs.path / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, small_fs.free_bytes() - layout.store_room_bytes)
    broker = SmallFsBroker(small_fs, tmp_path, layout.cq_file_entries).start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic(TOPIC, 1)
        assert broker.store_health() == "writable"
        messages = Messages(broker, layout.body_bytes)

        # Batches until one does not fit, then what is left one message at a time.
        for batch in (BATCH, 1):
            refused = messages.send_until_refused(batch)
            assert "No space left on device" in str(refused) and f"/store/{layout.refused}/" in str(refused), refused
        assert len(messages.acked) > 1000, f"refused after {len(messages.acked)} messages: {refused}"
        # Now the last bytes too: small writes (checkpoint, offsets, abort marker) fail as well.
        last_bytes = small_fs.path / "last-bytes"
        take_the_rest(small_fs, last_bytes)
        probe = small_fs.path / "probe"
        with pytest.raises(OSError):
            probe.write_bytes(b"x" * 4096)
        probe.unlink(missing_ok=True)
        time.sleep(CHECKPOINT_INTERVAL_S * 2)  # the checkpoint meets the full disk

        # Full: sends keep failing fast with the same clear error, the broker lives, says it is
        # full, and serves every acknowledged message.
        messages.assert_refused(layout.refused)
        assert broker.running(), broker.log_tail()
        assert broker.store_health() == "disk_full"
        messages.assert_all_readable()

        # A crash on the full disk, then a restart on it: nothing acknowledged is lost.
        broker.crash_and_restart()
        messages.assert_all_readable()
        # Recovery deletes the commitlog's spare file and creates it again in the background:
        # until then the space is free for a moment.
        wait_until(lambda: small_fs.free_bytes() < COMMITLOG_FILE_BYTES, 10)
        messages.assert_refused(layout.refused)
        assert broker.store_health() == "disk_full"

        # Space comes back: sends work again and the flag clears.
        filler.unlink()
        last_bytes.unlink()
        with Producer(brokers=broker.address, linger_ms=0) as producer:
            for _ in range(20):
                messages.send(producer, BATCH)
        assert broker.store_health() == "writable"
        messages.assert_all_readable()

        broker.crash_and_restart()
        messages.assert_all_readable()
        assert broker.store_health() == "writable"
        assert broker.running(), broker.log_tail()
    finally:
        broker.kill()


def test_a_store_file_cut_short_by_a_crash_does_not_kill_the_broker_on_a_full_disk(small_fs, tmp_path):
    """A crash between creating a store file and allocating its blocks leaves it short (here:
    empty). On restart on a full disk the broker must not die of SIGBUS on that file."""
    layout = LAYOUTS[1]
    with open(small_fs.path / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, small_fs.free_bytes() - layout.store_room_bytes)
    broker = SmallFsBroker(small_fs, tmp_path, layout.cq_file_entries).start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic(TOPIC, 1)
        messages = Messages(broker, layout.body_bytes)
        for batch in (BATCH, 1):
            refused = str(messages.send_until_refused(batch))
        take_the_rest(small_fs, small_fs.path / "last-bytes")
        broker.kill()
        # The consumeQueue file the refused send wanted, as a crash right after its open(O_CREAT) leaves it.
        queue_dir = small_fs.path / "broker" / "store" / "consumequeue" / TOPIC / "0"
        assert refused.endswith(": [Errno 28] No space left on device"), refused
        (queue_dir / Path(refused.split(" for ", 1)[1].split(":", 1)[0]).name).touch()
        broker.start()
        messages.assert_all_readable()
        messages.assert_refused(layout.refused)
        assert broker.running(), broker.log_tail()
    finally:
        broker.kill()


@pytest.fixture
def small_ext4(tmp_path) -> Iterator[SmallFs]:
    """A small ext4 (a loop-mounted image: root only), where store files get their blocks as they
    are written, unlike tmpfs where they are allocated whole."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        pytest.skip("a loop-mounted ext4 image needs root, mkfs.ext4 and mount")
    (tmp_path / "fs").mkdir()
    try:
        fs = _loop_ext4(tmp_path / "fs")
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"no loop-mounted ext4 image here: {err}")
    try:
        yield fs
    finally:
        fs.close()


def test_files_growing_on_a_full_ext4_refuse_sends_and_keep_every_acked_message(small_ext4, tmp_path):
    """Store files on ext4 are sparse and get blocks just before a write needs them: the full disk
    is met there, as an error that refuses the send (never a SIGBUS on the write through the map),
    and through a crash and restart on the full disk nothing acknowledged is lost."""
    filler = small_ext4.path / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, small_ext4.free_bytes() - 3 * MIB)
    broker = SmallFsBroker(small_ext4, tmp_path, 4096).start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic(TOPIC, 1)
        messages = Messages(broker, 1000)
        for batch in (BATCH, 1):
            refused = messages.send_until_refused(batch)
            assert "No space left on device" in str(refused), refused
        assert len(messages.acked) > 1000, f"refused after {len(messages.acked)} messages: {refused}"
        take_the_rest(small_ext4, small_ext4.path / "last-bytes")
        assert broker.running(), broker.log_tail()
        assert broker.store_health() == "disk_full"
        messages.assert_all_readable()

        broker.crash_and_restart()
        messages.assert_all_readable()
        with (Producer(brokers=broker.address, linger_ms=0, retries=0) as producer,
              pytest.raises(GmsError, match="No space left on device")):
            messages.send(producer, BATCH)
        assert broker.running(), broker.log_tail()

        filler.unlink()
        (small_ext4.path / "last-bytes").unlink()
        with Producer(brokers=broker.address, linger_ms=0) as producer:
            for _ in range(20):
                messages.send(producer, BATCH)
        assert broker.store_health() == "writable"
        broker.crash_and_restart()
        messages.assert_all_readable()
    finally:
        broker.kill()
