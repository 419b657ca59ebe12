"""Checks run inside the cgroup v2 VM (tests/cgroup2_vm.py), by test_cgroup2_vm.py: the guest
offers cpuset, memory and pids under cgroup v2 alone, and a cgroup made there with a cpuset,
memory.max and pids.max holds its processes to them.

Not named ``test_*``: pytest collects it only when given it by name, as the VM's run does. Run
on this hybrid host, every check here fails, as it should.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = {"cpuset", "memory", "pids"}


def _mounts() -> list[list[str]]:
    return [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A new child of the root cgroup, removed (its processes killed) afterwards. Only where
    /sys/fs/cgroup is cgroup2: on a hybrid host it is a tmpfs, where a "cgroup" would be a
    plain directory limiting nothing."""
    if [m for m in _mounts() if m[1] == str(CGROUP_ROOT) and m[2] == "cgroup2"] == []:
        pytest.fail(f"{CGROUP_ROOT} is not a cgroup2 mount: run this file in the cgroup v2 VM")
    path = CGROUP_ROOT / f"gbroker-check-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    if (path / "cgroup.kill").exists():
        (path / "cgroup.kill").write_text("1")
    for _ in range(1000):  # rmdir fails while the killed processes are still being reaped
        try:
            path.rmdir()
            break
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
            os.sched_yield()


def _spawn_in(cgroup: Path, *argv: str) -> subprocess.Popen[str]:
    """argv started inside cgroup from its first instruction (the child joins before exec)."""
    procs = cgroup / "cgroup.procs"

    def join() -> None:
        procs.write_text(str(os.getpid()))

    return subprocess.Popen(
        argv, preexec_fn=join, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_the_guest_has_cgroup_v2_alone_with_cpuset_memory_and_pids() -> None:
    mounts = _mounts()
    assert ["cgroup2", str(CGROUP_ROOT)] in [[m[2], m[1]] for m in mounts]
    assert [m for m in mounts if m[2] == "cgroup"] == []  # no v1 hierarchy at all
    controllers = set((CGROUP_ROOT / "cgroup.controllers").read_text().split())
    assert controllers >= CONTROLLERS
    assert set((CGROUP_ROOT / "cgroup.subtree_control").read_text().split()) >= CONTROLLERS
    assert Path("/proc/self/cgroup").read_text() == "0::/\n"


def test_a_cgroup_with_a_cpuset_memory_max_and_pids_max_holds_its_process(
    cgroup: Path,
) -> None:
    (cgroup / "cpuset.cpus").write_text("0")
    (cgroup / "memory.max").write_text(str(64 << 20))
    (cgroup / "pids.max").write_text("8")
    sleeper = _spawn_in(cgroup, "sleep", "600")
    try:
        assert Path(f"/proc/{sleeper.pid}/cgroup").read_text() == f"0::/{cgroup.name}\n"
        assert (cgroup / "cgroup.procs").read_text().split() == [str(sleeper.pid)]
        assert (cgroup / "cpuset.cpus.effective").read_text().strip() == "0"
        assert (cgroup / "memory.max").read_text().strip() == str(64 << 20)
        assert (cgroup / "pids.max").read_text().strip() == "8"
        assert os.sched_getaffinity(sleeper.pid) == {0}
        # The job cannot widen its cores past the cpuset: the kernel keeps them to it.
        os.sched_setaffinity(sleeper.pid, {0, 1})
        assert os.sched_getaffinity(sleeper.pid) == {0}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pids_max_refuses_a_fork_past_it(cgroup: Path) -> None:
    (cgroup / "pids.max").write_text("3")
    # The child (1 task) forks until refused, 20 times at most: 2 more fit under pids.max 3.
    # Its children wait for it to end (the pipe's end at their parent closes), and keep none of
    # its output open, so that it ends with it.
    forker = _spawn_in(
        cgroup,
        sys.executable,
        "-c",
        "import os\n"
        "ended, alive = os.pipe()\n"
        "forked, error = 0, None\n"
        "while forked < 20 and error is None:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as refused:\n"
        "        error = refused.errno\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.close(alive), os.closerange(1, ended)\n"
        "        os.read(ended, 1)\n"
        "        os._exit(0)\n"
        "    forked += 1\n"
        "print(forked, error, flush=True)\n",
    )
    out, err = forker.communicate(timeout=120)
    assert forker.returncode == 0, err
    assert out.split() == ["2", str(errno.EAGAIN)]
    events = dict(line.split() for line in (cgroup / "pids.events").read_text().splitlines())
    assert int(events["max"]) >= 1


def test_memory_max_kills_a_process_past_it(cgroup: Path) -> None:
    (cgroup / "memory.max").write_text(str(32 << 20))
    (cgroup / "memory.swap.max").write_text("0")
    hog = _spawn_in(cgroup, sys.executable, "-c", "data = b'x' * (96 << 20)")
    hog.communicate(timeout=120)
    assert hog.returncode == -signal.SIGKILL
    events = dict(line.split() for line in (cgroup / "memory.events").read_text().splitlines())
    assert int(events["oom_kill"]) == 1
