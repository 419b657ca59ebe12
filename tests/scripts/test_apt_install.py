"""scripts/setup/apt_install.sh (which every setup script installs Debian packages through) waits
for another apt or dpkg holding apt's locks, and says so, instead of failing at once.

The tests hold a real lock as apt does (an fcntl write lock on the lock file) in a process of
their own, run the script on a package that is installed already (pinned to its installed
version: nothing changes on the machine), release the lock once the script says it waits, and
expect it to succeed. Like the script, they need root (or sudo).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "setup" / "apt_install.sh"
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)  # fcntl(F_SETLKW), as apt and dpkg lock
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def _installed_package() -> str:
    """``NAME=VERSION`` of a package installed by hand (not as a dependency), so that installing
    it again changes nothing, not even its auto/manual mark."""
    manual = subprocess.run(
        ["apt-mark", "showmanual"], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in manual:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", name],
            capture_output=True,
            text=True,
        )
        status, _, version = done.stdout.partition(" ")
        if done.returncode == 0 and status == "installed":
            return f"{name}={version}"
    raise AssertionError("no package installed by hand to install again")


@pytest.mark.parametrize(
    "lock",
    [
        "/var/lib/dpkg/lock-frontend",  # apt-get install, dpkg through apt
        "/var/lib/dpkg/lock",  # a bare dpkg
        "/var/lib/apt/lists/lock",  # apt-get update
    ],
)
def test_it_waits_for_another_apt_and_says_so(lock: str) -> None:
    package = _installed_package()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        name = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        script = subprocess.Popen(
            ["bash", str(SCRIPT), package],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        guard = threading.Timer(300, script.kill)  # a script silent that long has failed
        guard.start()
        try:
            assert script.stderr is not None
            said = script.stderr.readline()
            assert script.poll() is None, said  # still waiting, not failed
        finally:
            guard.cancel()
            assert holder.stdin is not None
            holder.stdin.close()  # the other apt is done
            holder.wait(timeout=30)
        _, err = script.communicate(timeout=600)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert said == (
        f"apt_install.sh: another apt or dpkg holds {lock} (process {holder.pid}, {name});"
        " waiting for it, at most 600 s in all\n"
    )
    assert script.returncode == 0, said + err
