"""`gbroker serve` as a real process, driven by the `gbroker` client commands."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    topology = tmp_path / "one.yaml"
    save_topology(Topology([SiteSpec("solo", 4, http=url)], (), name="one"), topology)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gbroker",
            "serve",
            "--site",
            "solo",
            "--topology",
            str(topology),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"gbroker serve did not listen: {proc.communicate()[0]}")
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=20)[0]
        assert proc.returncode == 0, output
        assert "shutting down" in output


def test_submit_wait_status_output_and_errors(broker: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text('executable: /bin/echo\narguments: ["hi there"]\ntotal_cpu_count: {exact: 2}\n')
    done = gbroker("submit", str(job), "--broker", broker, "--wait", "--json")
    assert done.returncode == 0, done.stderr
    [status] = json.loads(done.stdout)
    assert status["state"] == "done"
    job_id = status["id"]
    env = {**os.environ, "GBROKER_URL": broker}
    assert gbroker("output", job_id, env=env).stdout == "hi there\n"
    assert json.loads(gbroker("status", job_id, "--json", env=env).stdout)["site"] == "solo"
    assert [j["id"] for j in json.loads(gbroker("jobs", "--json", env=env).stdout)] == [job_id]
    # For people: a table with local times and durations, no epoch seconds.
    shown = gbroker("status", job_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "waited" in shown.stdout
    assert "done" in shown.stdout
    local = time.strftime("%H:%M:%S", time.localtime(status["submitted_at"]))
    assert local in shown.stdout  # local time (the test may straddle midnight: rare)
    assert str(status["submitted_at"]) not in shown.stdout
    listed = gbroker("jobs", env=env).stdout
    assert listed.split()[:8] == ["JOB", "NAME", "STATE", "SITE", "SUBMITTED", "WAITED", "RAN",
                                  "EXIT"]  # fmt: skip
    assert job_id in listed
    missing = gbroker("status", "solo.404", env=env)
    assert missing.returncode == 2
    assert "unknown job" in missing.stderr
    bad = tmp_path / "bad.jsdl"
    bad.write_text("<JobDefinition")
    refused = gbroker("submit", str(bad), "--broker", broker)
    assert refused.returncode == 2
    assert f"{bad}: 400" in refused.stderr  # the file first, then the broker's reason
    assert "Traceback" not in refused.stderr


def test_exit_statuses_follow_one_convention(broker: str, tmp_path: Path) -> None:
    """0 done, 1 failed or cancelled, 2 the caller's mistake, 3 timed out (gbroker.cli.exits)."""
    env = {**os.environ, "GBROKER_URL": broker.removeprefix("http://")}  # no scheme: http
    failing = tmp_path / "fails.yaml"
    failing.write_text("executable: /bin/false\ntotal_cpu_count: {exact: 1}\n")
    failed = gbroker("submit", str(failing), "--wait", env=env)
    assert failed.returncode == 1, failed.stderr
    job_id = failed.stdout.splitlines()[0]
    assert gbroker("wait", job_id, env=env).returncode == 1  # the same job, the same answer
    slow = tmp_path / "slow.yaml"
    slow.write_text("executable: /bin/sleep\narguments: ['30']\ntotal_cpu_count: {exact: 1}\n")
    slow_id = gbroker("submit", str(slow), env=env).stdout.strip()
    timed_out = gbroker("wait", slow_id, "--timeout", "0.5", env=env)
    assert timed_out.returncode == 3
    assert "timed out after 0.5 s" in timed_out.stderr
    listed = gbroker("jobs", "--state", "running", "--json", env=env)
    assert [j["id"] for j in json.loads(listed.stdout)] == [slow_id]
    cancelled = gbroker("cancel", slow_id, "--json", env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert gbroker("wait", slow_id, env=env).returncode == 1
    by_state = gbroker("jobs", "--state", "failed,cancelled", "--limit", "1", "--json", env=env)
    assert [j["id"] for j in json.loads(by_state.stdout)] == [slow_id]  # the newest of the two
    assert json.loads(gbroker("jobs", "--site", "elsewhere", "--json", env=env).stdout) == []
    mine = json.loads(gbroker("jobs", "--mine", "--json", env=env).stdout)
    assert {j["submitter"] for j in mine} == {"admin"}
    usage = gbroker("wait", slow_id, "--timeout", "soon", env=env)
    assert usage.returncode == 2
    assert "--timeout: expected a number > 0" in usage.stderr


def test_missing_files_and_typos_name_the_file_and_field(broker: str, tmp_path: Path) -> None:
    env = {**os.environ, "GBROKER_URL": broker}
    missing = gbroker("submit", str(tmp_path / "nothere.jsdl"), env=env)
    assert missing.returncode == 2
    assert f"{tmp_path / 'nothere.jsdl'}: cannot read: No such file or directory" in missing.stderr
    job = tmp_path / "job.yaml"
    job.write_text("executable: /bin/true\ntotal_cpu_count: {exact: 1}\n")
    upload = gbroker("submit", str(job), "--upload", "missing.txt", env=env)
    assert upload.returncode == 2
    assert "--upload missing.txt: cannot read: No such file or directory" in upload.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("executabel: /bin/true\ntotal_cpu_count: {exact: 1}\n")
    refused = gbroker("submit", str(typo), env=env)
    assert refused.returncode == 2
    assert f"{typo}: 400" in refused.stderr
    assert "executabel" in refused.stderr
    for result in (missing, upload, refused):
        assert "Traceback" not in result.stderr


def test_several_files_and_a_directory_in_one_submit(broker: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("a.yaml", "b.json"):
        body = f'{{"executable": "/bin/echo", "arguments": ["{name}"]}}'
        (jobs / name).write_text(body)
    (jobs / "notes.txt").write_text("not a job")
    single = tmp_path / "c.yaml"
    single.write_text("executable: /bin/echo\narguments: [c]\n")
    env = {**os.environ, "GBROKER_URL": broker}
    done = gbroker("submit", str(jobs), str(single), "--wait", "--json", env=env)
    assert done.returncode == 0, done.stderr
    statuses = json.loads(done.stdout)
    assert [s["state"] for s in statuses] == ["done"] * 3
    outputs = [gbroker("output", s["id"], env=env).stdout for s in statuses]
    assert outputs == ["a.yaml\n", "b.json\n", "c\n"]
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = gbroker("submit", str(empty), env=env)
    assert nothing.returncode == 2
    assert f"{empty}: a directory with no job files" in nothing.stderr


def test_no_broker_found_and_broker_unreachable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GBROKER_URL", "GBROKER_FLEET")}
    lost = subprocess.run(
        [sys.executable, "-m", "gbroker", "jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # no .gbroker-fleet above, and the test run's default fleet is none
    )
    assert lost.returncode == 2
    assert "no running fleet found" in lost.stderr
    assert "--broker URL" in lost.stderr
    down = gbroker("jobs", "--broker", "127.0.0.1:9", env=env)
    assert down.returncode == 4
    assert "no broker answers: http://127.0.0.1:9: Connection refused" in down.stderr
    bad = gbroker("jobs", "--broker", "127.0.0.1:port", env=env)
    assert bad.returncode == 2
    assert "--broker: expected a port number" in bad.stderr
    assert "Traceback" not in down.stderr + bad.stderr


def test_a_plain_submit_imports_nothing_heavy(broker: str, tmp_path: Path) -> None:
    """`gbroker submit FILE` starts fast because it imports no parser, JSON, HTTP library or
    TLS (scripts/bench/bench_cli.py times it); this keeps it so."""
    job = tmp_path / "job.yaml"
    job.write_text("executable: /bin/true\n")
    # A fleet directory as `fleet up` writes it, for the lone broker of the fixture.
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "fleet.json").write_text(json.dumps({"sites": {"solo": {"url": broker}}}))
    (fleet / "brokers").write_text(f"solo {broker}\n")
    (fleet / "tokens").write_text((tmp_path / "data" / "tokens").read_text())
    heavy = ("argparse", "json", "http.client", "ssl", "aiohttp", "typing", "rich", "re")
    script = (
        "import sys; from gbroker.cli import main; code = main(['submit', sys.argv[1]]); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr); "
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(job)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GBROKER_FLEET": str(fleet)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("solo.")
    assert done.stderr.strip() == "[]"
