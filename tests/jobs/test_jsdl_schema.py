""":mod:`gbroker.jobs.jsdl_schema`: the official XSDs, which documents they accept, and that what
we write validates against them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import defusedxml.ElementTree as SafeET
import pytest
import xmlschema
from hypothesis import given, settings

from gbroker.jobs.description import JobDescription
from gbroker.jobs.documents import load_job_description
from gbroker.jobs.jsdl_write import to_jsdl
from tests.jobs.jsdl_documents import (
    DATA,
    EXPECTED,
    SCHEMA,
    Parsed,
    Rejected,
    _documents,
    _job,
    descriptions,
    jsdl_schema,
)

NOT_WELL_FORMED = {"gridway/HPCProfileExample.xml"}
# Schema-invalid documents, with a word the validator's complaint must contain. We accept all of
# them but staging_1..4 (no FileName) as real writers produce them.
SCHEMA_INVALID = {
    # <CandidateHost> (schema: CandidateHosts); Environment before Input in POSIXApplication.
    "gridway/POSIXProfileExample.xml": "CandidateHost",
    "gridway/basicExample.xml": "CandidateHost",
    # xsi:type names GridBean types that no schema here declares.
    "unicorex/ems__big.jsdl": "gridBeanParameter",
    # DataStaging without the required CreationFlag.
    "unicorex/ems__date_with_inlinedata.jsdl": "CreationFlag",
    "unicorex/ems__ls_with_stagein.jsdl": "CreationFlag",
    "unicorex/ems__stagein_problem.jsdl": "CreationFlag",
    "unicorex/ems__stageout_problem.jsdl": "CreationFlag",
    "unicorex/io__http1.jsdl": "CreationFlag",
    # HPC File Staging's StagingSchedule written in the JSDL namespace.
    "unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl": "StagingSchedule",
    "unicorex/jsdl__jsdl_sample_with_hpc_ext_nouser.jsdl": "StagingSchedule",
    # Argument after Input/Output/Error (the schema wants it right after Executable).
    "unicorex/jsdl__posix.jsdl": "Argument",
    # UNICORE's camel-case SPMD attributes; empty counts without xsi:nil; Argument order.
    "unicorex/jsdl__spmd.jsdl": "actualIndividualCPUCount",
    "unicorex/jsdl__spmd2.jsdl": "actualTotalCPUCount",
    # No FileName; staging_1/2 also leave URI unqualified.
    "unicorex/jsdl__staging_1.jsdl": "FileName",
    "unicorex/jsdl__staging_2.jsdl": "FileName",
    "unicorex/jsdl__staging_3.jsdl": "FileName",
    "unicorex/jsdl__staging_4.jsdl": "FileName",
}


def test_schema_validity_of_every_well_formed_document() -> None:
    schema = jsdl_schema()
    valid, invalid = set(), {}
    for name in _documents():
        if name in NOT_WELL_FORMED:
            with pytest.raises(xmlschema.XMLResourceError):
                schema.is_valid(str(DATA / name))
            continue
        errors = list(schema.iter_errors(str(DATA / name)))
        if errors:
            invalid[name] = " ".join(f"{e.reason} {e.path} {e}" for e in errors)
        else:
            valid.add(name)
    assert set(invalid) == set(SCHEMA_INVALID)
    for name, word in SCHEMA_INVALID.items():
        assert word in invalid[name], name
    # Valid by the schema yet not jobs we can run: the empty descriptions, the bare
    # IndividualCPUCount fragments (a global element of jsdl.xsd), and a POSIX UserName GBroker
    # does not honour. Staging-only ones run.
    rejected_but_valid = {n for n in valid if isinstance(EXPECTED[n], Rejected)}
    assert rejected_but_valid == {
        "unicorex/jsdl__ex_posix.jsdl",
        "unicorex/ems__empty.jsdl",
        "unicorex/jsdl__empty.jsdl",
        "unicorex/jsdl__range1.jsdl",
        "unicorex/jsdl__range2.jsdl",
        "unicorex/jsdl__range3.jsdl",
    }
    assert len(valid) == 43 - len(NOT_WELL_FORMED) - len(SCHEMA_INVALID) == 25


def test_what_we_write_is_schema_valid_for_every_parsed_document() -> None:
    schema = jsdl_schema()
    for name, want in EXPECTED.items():
        if isinstance(want, Parsed):
            schema.validate(to_jsdl(load_job_description(DATA / name)))


@settings(max_examples=60, deadline=None)
@given(descriptions())
def test_what_we_write_validates_against_the_official_xsds(desc: JobDescription) -> None:
    jsdl_schema().validate(to_jsdl(desc))


# -- OGF schemas: shipped, and what check says with and without --schema


def test_the_shipped_schemas_are_the_official_files_with_their_notice() -> None:
    from gbroker.jobs.jsdl_schema import SCHEMA_DIR

    for name in ("jsdl.xsd", "jsdl-posix.xsd", "jsdl-spmd.xsd"):
        shipped = (SCHEMA_DIR / name).read_bytes()
        assert shipped == (SCHEMA / name).read_bytes(), name
        assert b"Copyright (C)" in shipped
        assert b"All Rights Reserved" in shipped
    assert "unmodified" in (SCHEMA_DIR / "README.md").read_text()


def test_the_schema_is_loaded_only_for_jsdl_and_built_once_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gbroker.jobs import jsdl_schema

    yaml_job = tmp_path / "job.yaml"
    yaml_job.write_text("executable: /bin/true\n")
    probe = (
        "import sys\nfrom gbroker.cli import main\ncode = main(sys.argv[1:])\n"
        "print('xmlschema' in sys.modules, code)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", probe, "jsdl", "check", str(yaml_job)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.stdout.splitlines()[-1] == "False 0", done.stderr
    assert not (tmp_path / "cache").exists()
    # A JSDL document: validated, and the built schemas kept in the user's cache, 0600.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jsdl_schema._schema.cache_clear()
    try:
        assert jsdl_schema.schema_violations(SafeET.fromstring(_job())) == []
        [cached] = (tmp_path / "cache" / "gbroker").iterdir()
        assert cached.stat().st_mode & 0o777 == 0o600
        jsdl_schema._schema.cache_clear()
        assert isinstance(jsdl_schema._read_cache(cached), xmlschema.XMLSchema10)
        # One another user could have written is never unpickled.
        cached.chmod(0o620)
        assert jsdl_schema._read_cache(cached) is None
    finally:
        jsdl_schema._schema.cache_clear()
