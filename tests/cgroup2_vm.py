"""Run a command, or pytest on some tests, in a VM whose kernel has cgroup v2 alone.

This host is hybrid (cpuset, memory, pids bound to cgroup v1), so what a job's cgroup looks like
on a cgroup v2 host can only be shown in a kernel of its own: scripts/quality/cgroup2_vm.py boots
one (its docstring says how), with this host's files read-only under a writable overlay, cgroup2 at
/sys/fs/cgroup, the command run as root in the root cgroup from the checkout's root, and
``GBROKER_CGROUP2_VM=1`` in its environment. Its output (stdout and stderr together) is the
result's ``stdout``; the harness's own lines (the accelerator, the timings, why a boot failed)
its ``stderr``; its ``returncode`` is the command's (124: the timeout ended the VM; 125: the VM
could not run the command).

Emulated (no usable KVM on this project's machines), a boot takes 6-12 s and Python in the
guest runs about 10 times slower than here (its start 15-40 times): a pytest run of a few tests
takes 20-60 s.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence

from tests.conftest import ROOT

__all__ = ["pytest_in_cgroup2_vm", "run_in_cgroup2_vm"]

SCRIPT = [sys.executable, "-m", "scripts.quality.cgroup2_vm"]


def run_in_cgroup2_vm(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """argv run in the guest, from the checkout's root; env is added to the guest's."""
    settings = [f"--env={key}={value}" for key, value in (env or {}).items()]
    return subprocess.run(
        [*SCRIPT, f"--timeout={timeout}", *settings, "--", *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        # The harness ends the VM at its timeout; this only bounds the harness itself (a first
        # run also unpacks the kernel and builds the initramfs).
        timeout=timeout + 120,
        check=False,
    )


def pytest_in_cgroup2_vm(
    *tests: str,
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
    conftest: bool = True,
) -> subprocess.CompletedProcess[str]:
    """pytest run in the guest on the given files or node ids, in one process.

    Emulated, every import counts (pytest 5 s, tests/conftest.py's imports 10 s more), so only
    pytest-asyncio of the installed plugins is loaded (hypothesis's and xdist's would add 20 s),
    and with ``conftest=False`` no conftest.py at all (for tests that need none of its
    fixtures)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    argv += ["-p", "pytest_asyncio.plugin", *([] if conftest else ["--noconftest"])]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})}
    return run_in_cgroup2_vm([*argv, *tests], timeout, env)
