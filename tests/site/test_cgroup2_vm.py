"""A job's limits under cgroup v2, shown in a VM of its own (tests/cgroup2_vm.py): this host's
cgroups are hybrid, and no container or namespace on it can have cpuset, memory or pids under
cgroup2. Each test boots the VM once (emulated here: tens of seconds)."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cgroup2_vm import pytest_in_cgroup2_vm, run_in_cgroup2_vm
from tests.conftest import ROOT

# Tens of seconds each, an emulated CPU at 100% of a real one: alone, after the others (in the
# parallel phase it starved the tests that time things: five of them failed in a CI run).
pytestmark = pytest.mark.serial


def test_the_vm_runs_a_command_and_gives_back_its_output_and_status() -> None:
    written = ROOT / f".cgroup2-vm-{uuid.uuid4().hex[:8]}"
    # /proc/PID/stat's 5th and 6th fields: the process group and the session.
    script = 'cat /proc/self/cgroup; echo "$GREETING"; echo $$ $(cut -d" " -f5,6 /proc/$$/stat)'
    result = run_in_cgroup2_vm(
        ["sh", "-c", f"{script}; touch {written}; exit 3"],
        timeout=300,
        env={"GREETING": "hello from the guest"},
    )
    assert result.returncode == 3, result.stdout + result.stderr
    cgroup, greeting, ids = result.stdout.splitlines()
    assert (cgroup, greeting) == ("0::/", "hello from the guest")
    pid, group, session = ids.split()
    assert pid == group == session  # it leads a session of its own, as a service would
    assert not written.exists()  # the guest writes to an overlay, never to the host's files


# The site's own cgroup tests (tests/site/test_cgroups.py, test_cpu_share.py), run under cgroup
# v2: the jobs' cpusets, memory, process and CPU limits applied and seen in /proc/PID/cgroup and
# the controller files, both ways of starting a job, and nothing forked outliving a cancel.
V2_SITE_TESTS = (
    "tests/site/test_cgroups.py::test_a_jobs_cpuset_memory_and_pids_limits_are_applied",
    "tests/site/test_cgroups.py::test_a_job_cannot_widen_its_cores",
    "tests/site/test_cgroups.py::test_nothing_a_job_forked_outlives_it[cancel]",
    "tests/site/test_cgroups.py::test_the_process_limit_holds_for_the_whole_job_and_is_named",
    "tests/site/test_cgroups.py::test_a_resize_moves_the_cpuset",
    # A site's cpu_share: the cpu controller enabled down to the job's group, cpu.max.
    "tests/site/test_cpu_share.py::test_a_jobs_cpu_time_is_capped_at_the_sites_share",
    "tests/site/test_cpu_share.py::test_a_resize_moves_the_cap_with_the_cores",
)


def test_cgroup_v2_limits_hold_in_the_vm_and_the_sites_cgroup_tests_pass_there() -> None:
    # One boot for both (emulated, each boot and each pytest start costs tens of seconds): the
    # guest's own checks of cgroup v2 (tests/site/cgroup2_guest.py), then the site's.
    result = pytest_in_cgroup2_vm("tests/site/cgroup2_guest.py", *V2_SITE_TESTS, "-rA")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^12 passed\b", result.stdout, re.MULTILINE), result.stdout
    for test in V2_SITE_TESTS:  # each named passed (a parametrized one: each of its ids)
        assert f"PASSED {test}" in result.stdout, test
