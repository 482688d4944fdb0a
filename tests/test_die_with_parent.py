"""Children started through `gms.die_with_parent` die with their parent and never run its fork handlers."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gms.die_with_parent import dying_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_program_runs_with_its_arguments_and_exit_status() -> None:
    program = ["sh", "-c", 'echo "$0 $1"; exit 3', "a", "b c"]
    done = subprocess.run(dying_with_parent(program), check=False, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "a b c\n")


def test_program_keeps_the_pid_and_gets_the_death_signal() -> None:
    with subprocess.Popen(dying_with_parent(["sleep", "30"])) as child:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        status = Path(f"/proc/{child.pid}/status").read_text()
        child.kill()
    assert "Name:\tsleep" in status


def test_sigkilled_parent_takes_the_program_with_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        from gms.die_with_parent import dying_with_parent
        child = subprocess.Popen(dying_with_parent(["sleep", "60"]))
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-P", "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child_pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
        time.sleep(0.01)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 5
    while not gone(child_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(child_pid)


def test_a_parent_already_gone_means_the_program_never_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    args = dying_with_parent(["touch", str(marker)])
    args[args.index(str(os.getpid()))] = "1"  # as if our parent had died and init adopted us
    subprocess.run(args, check=True)
    assert not marker.exists()


def test_the_parents_fork_handlers_do_not_run_in_the_child(tmp_path: Path) -> None:
    """grpc registers fork handlers; running them in the child between fork and exec killed etcd."""
    marker = tmp_path / "fork-handler-ran"
    script = textwrap.dedent(
        f"""
        import os, subprocess
        from gms.die_with_parent import dying_with_parent
        os.register_at_fork(after_in_child=lambda: open({str(marker)!r}, "w").close())
        subprocess.run(dying_with_parent(["true"]), check=True, close_fds=True, process_group=0)
        """
    )
    subprocess.run([sys.executable, "-P", "-c", script], check=True)
    assert not marker.exists()
