"""Plant, one at a time, the bugs issue 10 (item 7) found surviving the suite; show what fails.

Each bug is planted in a copy of the checkout's tracked files (the checkout is left alone), and
the tests that should catch it are run against that copy. A bug that no test catches is reported
as SURVIVED and the exit status is 1. A bug whose code has changed so that it can no longer be
planted as written is reported as NOT PLANTED (exit status 2): rewrite it for the new code.

    usage: .venv/bin/python -m scripts.quality.planted_bugs
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts import ROOT

PYTEST = ROOT / ".venv" / "bin" / "pytest"

# (bug, file, code as it is, code with the bug, tests that should catch it)
PLANTS = [
    (
        "a restored owner grants a second claim (the guard on owned.granted dropped)",
        "gbroker/core/dispatch.py",
        "        if owned.granted is not None:\n"
        "            return [ClaimAnswer(job_id, site, granted=owned.granted == site)]\n",
        "",
        ["tests/core"],
    ),
    (
        "F(j)'s waiting test: free < rank -> free <= rank",
        "gbroker/core/ranking.py",
        "waits = free < rank or state.queued > 0",
        "waits = free <= rank or state.queued > 0",
        ["tests/core"],
    ),
    (
        "the journal's synchronous=FULL -> OFF",
        "gbroker/daemon/journal.py",
        'conn.execute("PRAGMA synchronous=FULL")',
        'conn.execute("PRAGMA synchronous=OFF")',
        ["tests/daemon/test_journal.py", "tests/daemon/test_journal_contract.py"],
    ),
    (
        "a JSDL exclusive upper bound: ceil(v) - 1 -> floor(v) - 1",
        "gbroker/jobs/jsdl_read.py",
        "whole = math.ceil(value) - 1 if exclusive",
        "whole = math.floor(value) - 1 if exclusive",
        ["tests/jobs/test_jsdl_read.py"],
    ),
    (
        "a submission acknowledged before the journal commits it",
        "gbroker/daemon/driver.py",
        "        if not await self.journal.submit(job_id, self.site, spec, now, submitter, key)"
        " and key:\n            return None\n",
        "        asyncio.ensure_future(self.journal.submit(job_id, self.site, spec, now,"
        " submitter, key))\n",
        ["tests/daemon/test_journal.py::test_a_submission_is_answered_only_after_its_commit"],
    ),
]


def copy_of_checkout(into: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for name in filter(None, listed.split("\0")):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, into / name)


def main() -> int:
    status = 0
    env = {
        **os.environ,
        "GBROKER_MODEL_EXAMPLES": os.environ.get("GBROKER_MODEL_EXAMPLES", "40"),
        # the tests' data beside the checkout, not beside the copy
        "GBROKER_SHARED_DATA": os.environ.get(
            "GBROKER_SHARED_DATA", str(ROOT.parent / "shared" / "data")
        ),
    }
    for bug, path, code, planted, tests in PLANTS:
        with tempfile.TemporaryDirectory(prefix="gbroker-plant-") as directory:
            tree = Path(directory)
            copy_of_checkout(tree)
            text = (tree / path).read_text()
            if text.count(code) != 1:
                print(f"NOT PLANTED  {bug}: {path} no longer has the code it changes")
                status = max(status, 2)
                continue
            (tree / path).write_text(text.replace(code, planted))
            run = subprocess.run(
                [str(PYTEST), "-q", "-p", "no:cacheprovider", *tests],
                cwd=tree,
                env={**env, "PYTHONPATH": str(tree)},  # the copy's gbroker, not the checkout's
                capture_output=True,
                text=True,
            )
        failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED ")]
        if run.returncode == 1 and failed:
            print(f"caught       {bug}: {len(failed)} tests fail")
            for line in failed:
                print(f"               {line.removeprefix('FAILED ').split(' - ')[0]}")
        else:
            print(f"SURVIVED     {bug} (pytest exit {run.returncode})")
            print(run.stdout[-2000:])
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
