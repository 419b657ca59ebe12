"""``gbroker jsdl check`` and ``gbroker jsdl fields``: a summary per valid file, one line per
invalid one, what brokers would refuse, and schema warnings."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gbroker.jobs.description import JobDescription
from gbroker.jobs.documents import load_job_description
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from tests import harness
from tests.jobs.jsdl_documents import DATA, DESC, FIXTURES, RES, _hpcpa, _job, _total

# ---------------------------------------------------------------------------------------------
# gbroker jsdl check


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    """``gbroker`` with no fleet to find: ``jsdl check`` judges offline (``--topology`` aside)."""
    env = {**os.environ, "GBROKER_FLEET": str(Path(__file__).parent / "no-fleet-here")}
    return harness.gbroker(*args, env=env, timeout=60)


def test_check_prints_a_summary_per_valid_file() -> None:
    spmd = str(DATA / "unicorex" / "jsdl__spmd.jsdl")
    fixture = str(FIXTURES / "malleable_mpi.yaml")
    done = gbroker("jsdl", "check", spmd, fixture)
    # The fixture's staging URLs (a gbroker:// source, a file: target) are ones brokers refuse.
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert f"{spmd}: ok\n  executable  /bin/date -v\n" in done.stdout
    assert f"{fixture}: a broker would refuse it\n" in done.stdout
    assert "  refused     staging[2].target: expected a URL with scheme http or https" in (
        done.stdout
    )
    assert "  cores       8 (rigid; SPMD OpenMPI, 8 processes, 4 per host)\n" in done.stdout
    assert "\n  name        heat-2d\n" in done.stdout
    assert "  executable  /opt/heat/bin/heat2d --grid '4096 x 4096'\n" in done.stdout
    assert "  cores       4..16 (malleable; SPMD MPICH2, 4 processes, 2 per host; " in done.stdout
    assert "  time limit  3600 s\n" in done.stdout
    assert "  stage in    grid.h5 <- gbroker://r1c1/sha256/" in done.stdout
    assert "  stage out   heat.out -> file:///home/user/results/heat.out\n" in done.stdout


def test_check_exits_1_with_one_line_per_invalid_file(tmp_path: Path) -> None:
    good = str(DATA / "unicorex" / "ems__sleep.jsdl")
    broken = str(DATA / "gridway" / "HPCProfileExample.xml")
    empty = str(DATA / "unicorex" / "ems__empty.jsdl")
    missing = str(tmp_path / "nope.jsdl")
    done = gbroker("jsdl", "check", good, broken, empty, missing)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"{good}: ok" in lines
    assert (
        f"{broken}: line 22, column 4: expected well-formed XML, "
        "got 'unbound prefix jsdl-hpcpa (no xmlns:jsdl-hpcpa in scope)'"
    ) in lines
    assert any(
        line.startswith(f"{empty}: JobDefinition/JobDescription: expected ") for line in lines
    )
    assert f"{missing}: cannot read: No such file or directory" in lines


def test_check_json_prints_a_list_with_one_object_per_file() -> None:
    spmd2 = str(DATA / "unicorex" / "jsdl__spmd2.jsdl")
    range1 = str(DATA / "unicorex" / "jsdl__range1.jsdl")
    fixture = str(FIXTURES / "malleable_mpi.jsdl")
    done = gbroker("jsdl", "check", "--json", "--site", "r0c0", spmd2, range1, fixture)
    assert done.returncode == 1
    ok, bad, mine = json.loads(done.stdout)
    assert (ok["file"], ok["ok"]) == (spmd2, True)
    assert from_mapping(ok["job"]) == load_job_description(spmd2)
    assert ok["job"]["processes_from_allocation"] is True
    assert ok["request"] == {
        "rank": 1,
        "max_rank": 1,
        "job_class": "rigid",
        "requested_time": None,
        "input_files": [],
    }
    assert (bad["file"], bad["ok"]) == (range1, False)
    assert bad["path"] == "IndividualCPUCount"
    assert bad["error"].startswith(f"{range1}: IndividualCPUCount: expected the root element")
    assert mine["request"]["input_files"] == [
        {"name": "grid.h5", "size": 268435456, "site": "r1c1"},
        {"name": "params.conf", "size": 25, "site": "r0c0"},
    ]
    assert mine["request"]["job_class"] == "malleable"


def test_check_json_exit_0_when_all_files_are_valid(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"executable": "/bin/true", "min_cores": 4}))
    done = gbroker("jsdl", "check", "--json", str(job))
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["request"]["rank"] == 4
    assert (report["refused_by_brokers"], report["schema"]) == ([], None)  # JSON: no schema
    # The fixture's staging is refused by brokers: not ok, exit 1, each reason listed.
    done = gbroker("jsdl", "check", "--json", str(FIXTURES / "malleable_mpi.json"))
    assert done.returncode == 1
    [report] = json.loads(done.stdout)
    assert (report["ok"], report["request"]["rank"]) == (False, 4)
    assert [r.split(":")[0] for r in report["refused_by_brokers"]] == [
        "staging[0].source",
        "staging[2].target",
    ]


def test_check_shows_a_sweep_as_an_array_and_what_brokers_would_refuse() -> None:
    sweep = str(FIXTURES / "sweep_echo_100.jsdl")
    uris = str(FIXTURES / "unsupported_uris.jsdl")
    done = gbroker("jsdl", "check", sweep, uris)
    assert done.returncode == 1, done.stderr  # the second: its URIs are refused
    assert f"{sweep}: ok, a sweep of 100 jobs; the first:\n" in done.stdout
    assert f"{uris}: a broker would refuse it\n" in done.stdout
    assert "  varies      name: echo-sweep-1, echo-sweep-2, echo-sweep-3, echo-sweep-4, ...\n" in (
        done.stdout
    )
    assert (
        "  refused     JobDefinition/JobDescription/DataStaging[1]/Source/URI: expected a URL "
        "with scheme http or https (not ftp:"
    ) in done.stdout
    assert "(not file: a file: URL names the broker's own disk" in done.stdout
    reports = json.loads(gbroker("jsdl", "check", sweep, uris, "--json").stdout)
    assert reports[0]["array"]["size"] == 100
    assert reports[0]["job"]["arguments"] == ["value", "1"]
    assert len(reports[1]["refused_by_brokers"]) == 2


def test_check_names_a_misspelt_element_and_submit_refuses_it(tmp_path: Path) -> None:
    job = tmp_path / "typo.jsdl"
    job.write_text(_job(resources=_total("<jsdl:Exact>64</jsdl:Exact>").replace("Count", "Cont")))
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    assert done.stdout == (
        f"{job}: {RES}/TotalCPUCont: expected an element JSDL defines in Resources (did you "
        "mean TotalCPUCount?), got 'TotalCPUCont'\n"
    )


def test_check_schema_prints_each_violation_with_its_path() -> None:
    basic = str(DATA / "gridway" / "basicExample.xml")
    posix = str(DATA / "unicorex" / "jsdl__posix.jsdl")
    done = gbroker("jsdl", "check", "--schema", posix, basic)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert f"{posix}: not valid by the JSDL schemas" in lines
    assert (
        "  schema      JobDefinition/JobDescription/Application/POSIXApplication: Unexpected "
        "child with tag 'jsdl-posix:Argument' at position 5."
    ) in lines
    assert f"{basic}: a broker would refuse it; not valid by the JSDL schemas" in lines
    assert (
        "  schema      JobDefinition/JobDescription/Resources: Unexpected child with tag "
        "'jsdl:CandidateHost' at position 1."
    ) in lines
    # A document GBroker refuses is still validated, each violation with its path.
    staging = str(DATA / "unicorex" / "jsdl__staging_4.jsdl")
    done = gbroker("jsdl", "check", "--schema", "--json", staging)
    [report] = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["schema"] == [
        {
            "path": f"{DESC}/DataStaging[{i}]",
            "reason": "Unexpected child with tag 'jsdl:Target' at position 1. Tag "
            "'jsdl:FileName' expected.",
        }
        for i in (1, 2)
    ]
    # Valid: exit 0, nothing more said.
    sleep = str(DATA / "unicorex" / "ems__sleep.jsdl")
    done = gbroker("jsdl", "check", "--schema", sleep)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, f"{sleep}: ok")
    assert "schema" not in done.stdout


def test_default_check_warns_where_the_schema_disagrees_without_failing() -> None:
    posix = str(DATA / "unicorex" / "jsdl__posix.jsdl")  # Argument after the streams
    spmd2 = str(DATA / "unicorex" / "jsdl__spmd2.jsdl")  # UNICORE's actualTotalCPUCount
    done = gbroker("jsdl", "check", posix, spmd2)
    assert done.returncode == 0, done.stdout
    warnings = [line for line in done.stdout.splitlines() if line.startswith("  warning")]
    assert warnings[0] == (
        "  warning     the JSDL schema disagrees: JobDefinition/JobDescription/Application/"
        "POSIXApplication: Unexpected child with tag 'jsdl-posix:Argument' at position 5."
    )
    assert (
        "  warning     the JSDL schema disagrees: JobDefinition/JobDescription/Application/"
        "SPMDApplication/NumberOfProcesses: attribute 'actualTotalCPUCount' not allowed"
    ) in warnings
    assert len(warnings) == 4


# -- what a broker refuses, checked before submitting


def test_check_exits_1_with_each_reason_a_broker_would_refuse(tmp_path: Path) -> None:
    job = tmp_path / "urn.yaml"
    job.write_text(
        "executable: /bin/true\nstaging:\n"
        "  - {file_name: in.txt, source: 'urn:example:data'}\n"
        "  - {file_name: out.txt, target: 'gbroker:store', creation_flag: append}\n"
    )
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == f"{job}: a broker would refuse it"
    assert (
        "  refused     staging[0].source: expected a URL with scheme http or https (not urn: a "
        "scheme GBroker does not stage), got 'urn:example:data'"
    ) in lines
    assert (
        "  refused     staging[1].creation_flag: expected overwrite or dontOverwrite for a "
        "stage-out (an HTTP PUT or the file store replaces a file; neither can append to one), "
        "got 'append'"
    ) in lines


def test_check_matches_requirements_against_a_topologys_sites(tmp_path: Path) -> None:
    from gbroker.topology import SiteSpec, Topology, save_topology

    topology = tmp_path / "grid.yaml"
    sites = [
        SiteSpec("a", 4, operating_system="LINUX"),
        SiteSpec("b", 16, operating_system="LINUX"),
    ]
    save_topology(Topology(sites, "full", name="grid"), topology)
    job = tmp_path / "big.jsdl"
    job.write_text(_job(resources=_total("<jsdl:Exact>64</jsdl:Exact>")))
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 1
    assert (
        f"  refused     {RES}/TotalCPUCount: expected a site of the fleet with 64 cores, got "
        "'16 cores at site b, the closest of 2'"
    ) in done.stdout.splitlines()
    job.write_text(_job(resources=_total("<jsdl:Exact>16</jsdl:Exact>")))
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 0, done.stdout
    missing = gbroker("jsdl", "check", "--topology", str(tmp_path / "nope.yaml"), str(job))
    assert missing.returncode == 2
    assert missing.stderr == (
        f"gbroker jsdl check: {tmp_path / 'nope.yaml'}: expected a readable topology file, got "
        "'No such file or directory'\n"
    )


def test_an_absolute_working_directory_is_taken_inside_the_job_directory(tmp_path: Path) -> None:
    doc = _job(_hpcpa("<hpcpa:WorkingDirectory>/scratch//run/</hpcpa:WorkingDirectory>"))
    desc = parse_jsdl(doc)
    assert (desc.working_directory, desc.run_directory) == ("/scratch/run", "scratch/run")
    assert parse_jsdl(to_jsdl(desc)) == desc
    assert from_mapping(to_mapping(desc)) == desc
    assert from_mapping({"executable": "x", "working_directory": "/"}).run_directory is None
    job = tmp_path / "hpcp.jsdl"
    job.write_text(doc)
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 0, done.stdout
    assert (
        "  working dir /scratch/run: the site starts the job in scratch/run in the job's "
        "directory (it keeps a job's paths inside its directory; filesystemName names a site's "
        "file system)"
    ) in done.stdout.splitlines()


def test_check_refuses_an_operating_system_outside_the_enumeration(tmp_path: Path) -> None:
    job = tmp_path / "linux.yaml"
    job.write_text("executable: /bin/true\noperating_system: Linux\n")
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    assert done.stdout == (
        f"{job}: operating_system: expected a value of JSDL's OperatingSystemName (did you "
        "mean LINUX?), got 'Linux'\n"
    )


def test_gbroker_jsdl_fields_lists_every_field_a_job_may_have(tmp_path: Path) -> None:
    from dataclasses import fields as dataclass_fields

    done = gbroker("jsdl", "fields")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    names = {f.name for f in dataclass_fields(JobDescription)} | {"sweep"}
    assert names <= listed
    assert "  staging[i]: file_name, source, target, creation_flag, delete_on_termination, " in (
        done.stdout
    )
    as_json = json.loads(gbroker("jsdl", "fields", "--json").stdout)
    assert set(as_json["fields"]) == names
    job = tmp_path / "typo.yaml"
    job.write_text("executable: /bin/true\ncors: 4\n")
    done = gbroker("jsdl", "check", str(job))
    assert (done.returncode, done.stdout) == (
        1,
        f"{job}: cors: expected a known field: did you mean 'min_cores' or 'max_cores'? (known "
        "fields: gbroker jsdl fields, or docs/JSDL.md), got 'cors'\n",
    )


# -- CandidateHosts and SPMD's counts: honoured, where they were read and dropped


def test_candidate_hosts_are_a_requirement_check_matches_to_sites(tmp_path: Path) -> None:
    from gbroker.topology import SiteSpec, Topology, save_topology

    desc = load_job_description(FIXTURES / "malleable_mpi.yaml")
    req = desc.requirements()
    assert req is not None
    assert req.candidate_hosts == ("r0c1", "r1c0")
    topology = tmp_path / "grid.yaml"
    sites = [SiteSpec(name, 16) for name in ("a", "b")]
    save_topology(Topology(sites, "full", name="grid"), topology)
    job = tmp_path / "hosts.jsdl"
    job.write_text(
        _job(
            resources="<jsdl:CandidateHosts><jsdl:HostName>c*</jsdl:HostName></jsdl:CandidateHosts>"
        )
    )
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 1
    assert (
        f"  refused     {RES}/CandidateHosts: expected a site of the fleet with the name c* "
        "(names it knows: a, b), got 'the name a at site a, the closest of 2'"
    ) in done.stdout.splitlines()
    job.write_text(job.read_text().replace(">c*<", ">B<"))
    assert gbroker("jsdl", "check", "--topology", str(topology), str(job)).returncode == 0
