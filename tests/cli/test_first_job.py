"""A user's first session, as the README tells it: `fleet up`, then `submit`, `wait`,
`output`, `jobs` and `fleet down` from any directory under the project, with no URL, port or
token typed; the client fails over to a live broker; the fleet's lifecycle has no surprises."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker as run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def job_processes(job_id: str) -> list[int]:
    """Processes whose environment says they are (part of) the job."""
    marker = f"GBROKER_JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def process_titles() -> list[str]:
    """Every process's command line as ps shows it (arguments joined by spaces)."""
    titles = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                raw = (proc / "cmdline").read_bytes()
                titles.append(raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return titles


def test_first_job_from_any_directory_with_nothing_typed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    deep = project / "src" / "deeper"
    deep.mkdir(parents=True)
    topology = project / "three.yaml"
    sites = [SiteSpec("a", 2), SiteSpec("b", 2), SiteSpec("c", 8)]
    save_topology(Topology(sites, "full", name="three"), topology)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]  # the test run's
    up = run("fleet", "up", "--topology", "three.yaml", cwd=project, env=env)
    assert up.returncode == 0, up.stderr
    assert (project / ".gbroker-fleet" / "fleet.json").exists()
    assert f"from {project} and the directories under it" in up.stdout
    # The example it names exists from here: the shipped one by its path (none is here).
    assert f"  gbroker submit {EXAMPLES / 'hello.yaml'}\n" in up.stdout
    record = json.loads((project / ".gbroker-fleet" / "fleet.json").read_text())
    try:
        submitted = run("submit", str(EXAMPLES / "hello.yaml"), cwd=deep, env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        waited = run("wait", job_id, "--json", cwd=deep, env=env)
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["state"] == "done"
        output = run("output", job_id, cwd=project / "src", env=env)
        assert output.stdout.startswith("hello from site "), output.stderr
        listed = run("jobs", cwd=deep, env=env)
        assert job_id in listed.stdout
        # Outside the project, the fleet brought up last is the user's default.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert job_id in run("jobs", cwd=elsewhere, env=env).stdout
        named = {**env, "GBROKER_FLEET": str(tmp_path / "nowhere")}  # a typo is no fall-back
        assert "$GBROKER_FLEET names" in run("jobs", cwd=deep, env=named).stderr
        # ps shows each site's job launcher (the jobs' supervisor) by a short title.
        titles = [title for title in process_titles() if title.startswith("gbroker launcher ")]
        # Its job directories' root: under the fleet, or where jobs' accounts reach them
        # when they cannot search the fleet's directory (pytest's is 0700).
        jobs_root = record.get("jobs_root", str(project / ".gbroker-fleet"))
        assert f"gbroker launcher {jobs_root}/" in " ".join(titles), titles
        # `topology show` of the file the fleet runs says where its sites really are.
        shown = run("topology", "show", "three.yaml", cwd=project, env=env)
        assert record["sites"]["a"]["url"] in shown.stdout, shown.stdout

        # A broker down: the client goes to another one, every time.
        killed = run("fleet", "kill", "a", cwd=deep, env=env)
        assert killed.returncode == 0, killed.stderr
        again = run("fleet", "kill", "a", cwd=deep, env=env)
        assert again.returncode == 1
        assert "a is not running" in again.stderr
        ids = [
            run("submit", str(EXAMPLES / "hello.yaml"), cwd=deep, env=env).stdout.strip()
            for _ in range(4)
        ]
        assert all(ids), ids
        assert not any(i.startswith("a.") for i in ids)
        partial = run("jobs", cwd=deep, env=env)  # the others' jobs, and a word about a
        assert partial.returncode == 0, partial.stderr
        assert f"{record['sites']['a']['url']} did not answer" in partial.stderr
        assert ids[0] in partial.stdout
        live = run("fleet", "restart", "b", cwd=deep, env=env)
        assert live.returncode == 1
        assert "b is running" in live.stderr
        assert "--force" in live.stderr
        assert run("fleet", "restart", "a", cwd=deep, env=env).returncode == 0

        # A long job running when the fleet goes down is stopped, and counted.
        sleeper = project / "sleep.yaml"
        sleeper.write_text("executable: /bin/sleep\narguments: ['300']\n")
        long_id = run("submit", "sleep.yaml", cwd=project, env=env).stdout.strip()
        deadline = time.monotonic() + 30
        while (
            json.loads(run("status", long_id, "--json", cwd=deep, env=env).stdout)["state"]
            != "running"
        ):
            assert time.monotonic() < deadline, "the sleeper never started"
            time.sleep(0.2)
    finally:
        down = run("fleet", "down", cwd=deep, env=env)
    assert down.returncode == 0, down.stderr
    assert "stopped 1 running job: " in down.stdout, down.stdout
    assert not (project / ".gbroker-fleet" / "fleet.json").exists()
    assert not job_processes(long_id)  # nothing runs on
    assert "no running fleet found" in run("jobs", cwd=deep, env=env).stderr
