"""``gbroker image build``: a GBroker container image made without any registry.

Theory of operation. Two layers, both built on this host:

1. **The base image** ``gbroker-base:bookworm``: a minimal Debian (``mmdebstrap --variant=minbase``)
   with Python, venv, CA certificates, iproute2 (``tc`` shapes a container's link), mosquitto
   (a fleet's MQTT broker may be one) and tini (PID 1: it reaps what a killed broker leaves),
   from the Debian mirror this host's apt already uses, piped into ``docker import``. Kept once
   made (its build is the slow part of a first ``gbroker image build``: docs/DEPLOY.md).
2. **The GBroker image** on top: the project and every dependency are built as wheels *on the
   host* (``pip wheel``; the host's Python 3.11 is bookworm's, so the wheels fit) and installed
   offline in the image (``pip install --no-index``): nothing inside the build needs the network,
   so no registry, no TLS from inside, no proxy. Docker's legacy builder builds it
   (``DOCKER_BUILDKIT=0``; BuildKit needs buildx, often missing), never pulling. The image is
   labelled with a hash of the sources it holds; a build whose label already exists is skipped.

The image's entry point is ``tini -s -- sleep infinity``: a fleet container idles, and its broker
is started inside it with ``docker exec`` (:mod:`gbroker.fleet`), so that killing the broker
does not stop the container and its running jobs.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import gbroker
from gbroker.errors import GBrokerError

__all__ = [
    "BASE_IMAGE",
    "DEFAULT_TAG",
    "DOCKERFILE",
    "LABEL",
    "ImageError",
    "apt_mirror",
    "build",
    "image_sources",
    "source_hash",
]

BASE_IMAGE = "gbroker-base:bookworm"
DEFAULT_TAG = "gbroker:local"
LABEL = "org.gbroker.source"
_PACKAGES = "python3,python3-venv,ca-certificates,iproute2,mosquitto,tini,procps"
_ROOT = Path(gbroker.__file__).resolve().parent.parent  # the checkout: pyproject.toml's

DOCKERFILE = f"""\
FROM {BASE_IMAGE}
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/gbroker \\
 && /opt/gbroker/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels gbroker \\
 && rm -rf /tmp/wheels
ENV PATH=/opt/gbroker/bin:$PATH
ENTRYPOINT ["tini", "-s", "--"]
CMD ["sleep", "infinity"]
"""


class ImageError(GBrokerError):
    """The image cannot be built here."""


def _run(command: list[str], **options: object) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(command, capture_output=True, check=False, **options)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-8:]
        raise ImageError(f"{' '.join(command[:4])} ...: " + " | ".join(tail))
    return done  # type: ignore[no-any-return]


def _docker_ready() -> None:
    if shutil.which("docker") is None:
        raise ImageError("docker is not installed: run scripts/setup/ensure_docker.sh (as root)")
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        raise ImageError("no Docker daemon answers: run scripts/setup/ensure_docker.sh (as root)")


def source_hash(root: Path = _ROOT) -> str:
    """A hash of what the image holds: the packages' sources and the project file."""
    digest = hashlib.sha256()
    files = [root / "pyproject.toml"]
    for package in ("gbroker", "netmon", "dcsmon"):
        files += sorted((root / package).rglob("*.py"))
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def image_sources(tag: str) -> str | None:
    """The source hash image ``tag`` was built from (None: no such image, or not ours)."""
    return _image_label(tag) or None


def _image_label(tag: str) -> str | None:
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}"}}}}', tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def apt_mirror() -> str:
    """The Debian mirror this host's apt uses (deb822 sources or sources.list)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[1]
    return "http://deb.debian.org/debian"


def _base(progress: Callable[[str], None]) -> None:
    if _image_label(BASE_IMAGE) is not None:
        return
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is not installed: run scripts/setup/ensure_docker.sh (as root)"
        )
    mirror = apt_mirror()
    progress(f"base image {BASE_IMAGE}: mmdebstrap bookworm from {mirror} (about a minute)")
    debootstrap = subprocess.Popen(
        ["mmdebstrap", "--variant=minbase", f"--include={_PACKAGES}", "bookworm", "-", mirror],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert debootstrap.stdout is not None
    imported = subprocess.run(
        ["docker", "import", "-", BASE_IMAGE],
        stdin=debootstrap.stdout,
        capture_output=True,
        check=False,
    )
    debootstrap.stdout.close()
    _, errors = debootstrap.communicate()
    if debootstrap.returncode != 0 or imported.returncode != 0:
        tail = (errors + imported.stderr).decode(errors="replace").strip().splitlines()[-8:]
        raise ImageError("the base image could not be made: " + " | ".join(tail))


def build(
    tag: str = DEFAULT_TAG,
    *,
    force: bool = False,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> str:
    """Build (or keep) the GBroker image ``tag``; returns the source hash it holds."""
    _docker_ready()
    wanted = source_hash()
    if not force and _image_label(tag) == wanted:
        progress(f"{tag} is up to date (sources {wanted})")
        return wanted
    _base(progress)
    with tempfile.TemporaryDirectory(prefix="gbroker-image-") as tmp:
        context = Path(tmp)
        progress("wheels: the project and its dependencies, built on this host")
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir",
              str(context / "wheels"), str(_ROOT)])  # fmt: skip
        (context / "Dockerfile").write_text(DOCKERFILE)
        progress(f"image {tag}: installing the wheels offline (legacy builder, no pull)")
        _run(
            ["docker", "build", "--quiet", "--label", f"{LABEL}={wanted}", "-t", tag, str(context)],
            env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
        )
    progress(f"{tag} built (sources {wanted})")
    return wanted
