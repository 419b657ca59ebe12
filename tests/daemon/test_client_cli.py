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

from gbroker.ports import free_port
from gbroker.topology import SiteSpec, Topology, save_topology


def gbroker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


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
    done = gbroker("submit", str(job), "--broker", broker, "--wait")
    assert done.returncode == 0, done.stderr
    job_id, status_line = done.stdout.splitlines()
    assert json.loads(status_line)["state"] == "done"
    env = {**os.environ, "GBROKER_URL": broker}
    assert gbroker("output", job_id, env=env).stdout == "hi there\n"
    assert json.loads(gbroker("status", job_id, env=env).stdout)["site"] == "solo"
    assert [j["id"] for j in json.loads(gbroker("jobs", env=env).stdout)] == [job_id]
    missing = gbroker("status", "solo.404", env=env)
    assert missing.returncode == 2
    assert "unknown job" in missing.stderr
    bad = tmp_path / "bad.jsdl"
    bad.write_text("<JobDefinition")
    refused = gbroker("submit", str(bad), "--broker", broker)
    assert refused.returncode == 2
    assert "400" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_no_broker_named_and_broker_unreachable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GBROKER_URL"}
    assert "--broker" in gbroker("jobs", env=env).stderr
    down = gbroker("jobs", "--broker", "http://127.0.0.1:9", env=env)
    assert down.returncode == 2
    assert "127.0.0.1:9" in down.stderr
