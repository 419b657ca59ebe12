"""Issue 26's "a job pinned by `candidate_hosts` runs only there, 20 of 20, on a fleet", through
the `gbroker` command and a live fleet (`gbroker fleet up`): pinned to a site by its name, or to
a host of a site (a node the topology names), from a YAML file and a JSDL document alike,
submitted to every broker; `gbroker explain` names the sites the pin leaves out, and a job that
names no site or host of the fleet is refused with the names the fleet knows.

tests/sim/test_requirements.py places the same jobs in the simulator, on the same sites."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import harness

pytestmark = pytest.mark.network

FIXTURES = Path(__file__).parents[1] / "fixtures"
TOPOLOGY = FIXTURES / "pinned-3.yaml"  # L4001; P4-18, one host; Xeon80, hosts x01 .. x04

#: Each pinned job of tests/fixtures/jsdl and the one site where it may run (the simulator's
#: test places the same jobs on the same topology).
PINNED = {
    "pinned_site.yaml": "P4-18",  # the site by name
    "pinned_host.yaml": "Xeon80",  # x03, a host of Xeon80
    "pinned_site_host.json": "Xeon80",  # xeon80/X0*
    "pinned_site.jsdl": "P4-18",  # p4-*
    "pinned_host.jsdl": "Xeon80",  # Xeon80/x01
}


def gbroker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """The harness's, with fleets' time to answer; never a traceback."""
    done = harness.gbroker(*args, timeout=180, check=check)
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A fleet of tests/fixtures/pinned-3.yaml: each site's broker URL."""
    directory = tmp_path_factory.mktemp("hosts-cli") / "fleet"
    gbroker("fleet", "up", "--topology", str(TOPOLOGY), "--dir", str(directory), check=True)
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield {site: entry["url"] for site, entry in record["sites"].items()}
    finally:
        gbroker("fleet", "down", "--dir", str(directory), check=True)


def submit_20(job: Path, brokers: dict[str, str]) -> list[str]:
    """20 submissions of ``job``, spread over every broker of the fleet (each owns some)."""
    urls = sorted(brokers.values())
    ids: list[str] = []
    for k, url in enumerate(urls):
        n = 20 // len(urls) + (k < 20 % len(urls))
        done = gbroker("submit", *[str(job)] * n, "--broker", url, "--json", check=True)
        ids.extend(answer["id"] for answer in json.loads(done.stdout))
    assert len(ids) == 20
    return ids


def where_they_ran(ids: list[str], broker: str) -> list[tuple[str, str]]:
    done = gbroker("wait", *ids, "--broker", broker, "--timeout", "150", "--json", check=True)
    statuses = json.loads(done.stdout)
    assert sorted(s["id"] for s in statuses) == sorted(ids)
    return [(s["state"], s["site"]) for s in statuses]


@pytest.mark.parametrize(("name", "site"), PINNED.items())
def test_a_pinned_job_runs_only_there_20_of_20(fleet: dict[str, str], name: str, site: str) -> None:
    ids = submit_20(FIXTURES / "jsdl" / name, fleet)
    owners = {job_id.split(".")[0] for job_id in ids}
    assert owners == {"L4001", "P4-18", "Xeon80"}  # every broker owns some
    assert where_they_ran(ids, fleet["L4001"]) == [("done", site)] * 20


def test_explain_names_the_sites_the_pin_leaves_out(fleet: dict[str, str]) -> None:
    job = FIXTURES / "jsdl" / "pinned_host.yaml"  # x03
    submitted = gbroker("submit", str(job), "--broker", fleet["P4-18"], check=True)
    job_id = submitted.stdout.strip()
    explained = gbroker("explain", job_id, "--broker", fleet["P4-18"], check=True).stdout
    lines = {line.split()[0]: line for line in explained.splitlines()[1:] if line.startswith("  ")}
    assert lines["Xeon80"].endswith("best starts now, on its hosts x03"), explained
    for left_out in ("L4001", "P4-18"):
        assert lines[left_out].endswith(
            f"not a candidate: candidate_hosts: the job needs the name x03; "
            f"site {left_out} has the name {left_out}"
        ), explained
    answer = json.loads(
        gbroker("explain", job_id, "--broker", fleet["P4-18"], "--json", check=True).stdout
    )
    [chosen] = [c for c in answer["candidates"] if c["feasible"]]
    assert (chosen["site"], chosen["hosts"]) == ("Xeon80", ["x03"])
    out = {c["site"]: c for c in answer["candidates"] if not c["feasible"]}
    assert sorted(out) == ["L4001", "P4-18"]
    assert {c["need"] for c in out.values()} == {"candidate_hosts"}


def test_a_job_that_names_no_site_or_host_of_the_fleet_is_refused_with_the_names_it_knows(
    fleet: dict[str, str], tmp_path: Path
) -> None:
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text("executable: /bin/true\ncandidate_hosts: [node7.example.org]\n")
    for job, field in [
        (nowhere, "candidate_hosts"),
        (FIXTURES / "jsdl" / "pinned_nowhere.jsdl",  # P4-18/x01: P4-18 is one host, P4-18
         "JobDefinition/JobDescription/Resources/CandidateHosts"),
    ]:  # fmt: skip
        refused = gbroker("submit", str(job), "--broker", fleet["L4001"])
        assert refused.returncode == 2
        assert f"400: {field}: expected a site of the fleet with the name " in refused.stderr
        assert (
            "(names it knows: L4001, P4-18, Xeon80, Xeon80/x01, Xeon80/x02, Xeon80/x03, "
            "Xeon80/x04), got 'the name L4001 at site L4001, the closest of 3'"
        ) in refused.stderr, refused.stderr
        checked = gbroker("jsdl", "check", "--topology", str(TOPOLOGY), str(job))
        assert checked.returncode == 1
        assert "names it knows: L4001, P4-18, Xeon80" in checked.stdout


def test_a_job_pinned_to_a_host_runs_on_that_hosts_cores(
    fleet: dict[str, str], tmp_path: Path
) -> None:
    """Xeon80's 8 core slots are its 4 hosts' runs of 2: a job held to x03 gets slot 4 or 5."""
    job = tmp_path / "where.yaml"
    job.write_text(
        "executable: /bin/sh\narguments: [-c, 'echo $GBROKER_SLOTS']\ncandidate_hosts: [x03]\n"
    )
    for _ in range(3):
        submitted = gbroker("submit", str(job), "--broker", fleet["L4001"], check=True)
        job_id = submitted.stdout.strip()
        gbroker("wait", job_id, "--broker", fleet["L4001"], "--timeout", "60", check=True)
        output = gbroker("output", job_id, "--broker", fleet["L4001"], check=True)
        assert output.stdout in ("4\n", "5\n")
