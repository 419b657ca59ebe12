"""The application library a site gives every job: the package :mod:`gbroker.app`, importable by
whatever Python the job runs, with nothing installed (ARCHITECTURE §7).

Theory of operation. A job's program speaks the resize protocol through
:mod:`gbroker.app.malleable`; it should not have to upload it, nor find GBroker installed. Once
per job root, :func:`prepare` copies the installed ``gbroker/app/*.py`` into
``<root>/.gbroker-app/<digest>/gbroker/app/``, beside a stub ``gbroker/__init__.py``, read-only
(directories 0555, files 0444) and readable by every account a job may run as. The executor
puts ``<root>/.gbroker-app/<digest>`` at the end of each job's ``PYTHONPATH`` (after what the
job set itself, so a job's own copy wins) and names it in ``GBROKER_APP_PATH``
(:data:`APP_PATH_ENV`). Only that: never the broker's virtualenv or site-packages, of which a
job sees nothing.

The digest names the files' content: a broker upgraded over the same root makes a directory of
its own and leaves the one that older jobs have on their path. A directory is made under a
temporary name and renamed into place, so a job, or another broker over the same root, sees all
of it or nothing; one already there is used as it is.

The stub extends its package's path (:func:`pkgutil.extend_path`), so a job with a GBroker of
its own installed (a workflow that submits jobs) still imports the rest of it from there;
``gbroker.app`` comes from the site.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import gbroker.app

__all__ = ["APP_PATH_ENV", "DIRECTORY", "prepare"]

APP_PATH_ENV = "GBROKER_APP_PATH"
"""The variable that names, in a job's environment, the directory holding ``gbroker.app``."""
DIRECTORY = ".gbroker-app"
"""In a job root: the application libraries, one directory per content digest."""

_STUB = '''"""GBroker's application library, as a site gives it to its jobs ($GBROKER_APP_PATH):
the package gbroker.app only. A GBroker installed of the job's own provides the rest."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
'''


def _sources() -> list[Path]:
    """The installed files of :mod:`gbroker.app`, by name."""
    return sorted(Path(gbroker.app.__file__).parent.glob("*.py"))


def prepare(root: Path) -> Path:
    """The directory to put on a job's ``PYTHONPATH`` under ``root``, made if it is not there.

    Raises :class:`OSError` if it cannot be made (the caller starts jobs without it)."""
    sources = _sources()
    digest = hashlib.sha256(_STUB.encode())
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    libraries = root / DIRECTORY
    target = libraries / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    libraries.mkdir(mode=0o755, parents=True, exist_ok=True)
    libraries.chmod(0o755)  # jobs of every account pass through; only the broker writes here
    made = Path(tempfile.mkdtemp(prefix=".making-", dir=libraries))
    try:
        package = made / "gbroker"
        (package / "app").mkdir(parents=True)
        (package / "__init__.py").write_text(_STUB)
        for source in sources:
            shutil.copyfile(source, package / "app" / source.name)
        for directory, _, files in os.walk(made, topdown=False):
            for name in files:
                os.chmod(os.path.join(directory, name), 0o444)
            os.chmod(directory, 0o555)
        try:
            made.rename(target)
        except OSError:  # another broker over the same root made it meanwhile
            if not target.is_dir():
                raise
    finally:
        if made.exists():
            _remove(made)
    return target


def _remove(path: Path) -> None:
    """Remove a read-only tree of ours."""
    for directory, _, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o755)
    shutil.rmtree(path, ignore_errors=True)
