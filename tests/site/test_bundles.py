"""A moving job's bundle (gbroker.site.bundles): made as the job's account, taken apart where no
job reaches, capped at apparent sizes, sparse files kept sparse. Real files, real GNU tar, root
(CI is root) packing as ``nobody``."""

from __future__ import annotations

import io
import os
import pwd
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.site import bundles

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="packs as another account (CI is root)")

NOBODY = pwd.getpwnam("nobody")
ACCOUNT = (NOBODY.pw_uid, NOBODY.pw_gid)
SECRET = b"root's own secret, 0600"


def searchable_tmp() -> Iterator[Path]:
    """A ``tmp_path`` like pytest's, but searchable by every account, as a fleet's directories
    are, so that a job's account reaches what is in it (pytest keeps its root 0700, and makes
    it so again whenever a session starts)."""
    path = Path(tempfile.mkdtemp(prefix="gbroker-site-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_tmp_path = pytest.fixture(name="tmp_path")(searchable_tmp)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """``tmp_path`` (searchable by the job's account) with a root-only secret file in it."""
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "secret").chmod(0o600)
    return tmp_path


def job_dir(site: Path) -> Path:
    """A job's directory, its account's, with a file, a link and an image beside it."""
    directory = site / "jobs" / "job1"
    directory.mkdir(parents=True)
    (directory / "data").write_bytes(b"the job's own data")
    (directory / "sub").mkdir()
    (directory / "sub" / "more").write_text("more")
    for path in (directory, directory / "data", directory / "sub", directory / "sub" / "more"):
        os.lchown(path, *ACCOUNT)
    directory.chmod(0o700)
    image = site / "moving" / bundles.IMAGE
    image.mkdir(parents=True, mode=0o700)
    (image / "core.img").write_bytes(b"an image")
    return directory


def bundled(bundle: Path) -> dict[str, bytes | str]:
    """A bundle's members: a file's content, a link's target."""
    found: dict[str, bytes | str] = {}
    with tarfile.open(bundle, "r:", ignore_zeros=True) as tar:
        for member in tar:
            if member.issym():
                found[member.name] = member.linkname
            elif member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                found[member.name] = extracted.read()
    return found


@pytest.mark.asyncio
async def test_a_job_directory_is_read_as_its_account_never_through_a_link(site: Path) -> None:
    directory = job_dir(site)
    os.symlink(site / "secret", directory / "link")  # what a job swaps in for a file
    os.symlink(site, directory / "up")  # and for a directory
    os.lchown(directory / "link", *ACCOUNT)
    bundle = site / "moving" / "bundle.tar"
    digest, size = await bundles.pack(
        bundle, site / "moving" / bundles.IMAGE, directory, ACCOUNT, 1 << 20
    )
    members = bundled(bundle)
    assert members["image/core.img"] == b"an image"
    assert members["job/data"] == b"the job's own data"
    assert members["job/sub/more"] == b"more"
    assert members["job/link"] == str(site / "secret")  # the link, as a link
    assert SECRET not in bundle.read_bytes()
    assert size == bundle.stat().st_size
    assert len(digest) == 64


@pytest.mark.asyncio
async def test_what_the_account_cannot_read_is_not_packed(site: Path) -> None:
    directory = job_dir(site)
    root_only = directory / "planted"  # a root file in the job's directory: not the job's to move
    root_only.write_bytes(SECRET)
    root_only.chmod(0o600)
    with pytest.raises(bundles.BundleError, match="Permission denied"):
        await bundles.pack(
            site / "moving" / "bundle.tar", site / "moving" / "image", directory, ACCOUNT, 1 << 20
        )
    assert not (site / "moving" / "bundle.tar").exists()


@pytest.mark.asyncio
async def test_a_sparse_file_stays_sparse_and_counts_its_apparent_size(site: Path) -> None:
    directory = job_dir(site)
    sparse = directory / "sparse"
    with sparse.open("wb") as file:
        file.truncate(64 << 20)
        file.seek(32 << 20)
        file.write(b"middle")
    os.lchown(sparse, *ACCOUNT)
    bundle = site / "moving" / "bundle.tar"
    _, size = await bundles.pack(bundle, site / "moving" / "image", directory, ACCOUNT, 1 << 30)
    assert size < 1 << 20  # the holes are not in it
    target = site / "target"
    target.mkdir(mode=0o700)
    bundles.unpack(bundle, target, 1 << 30)
    placed = site / "jobs-b" / "job1"
    bundles.place(bundles.staged_job(target / bundles.IMAGE), placed, *ACCOUNT)
    unpacked = os.stat(placed / "sparse")
    assert unpacked.st_size == 64 << 20
    assert unpacked.st_blocks * 512 < 1 << 20  # still sparse
    assert (placed / "sparse").read_bytes()[32 << 20 : (32 << 20) + 6] == b"middle"
    assert (unpacked.st_uid, unpacked.st_gid) == ACCOUNT
    assert os.stat(placed).st_uid == ACCOUNT[0]
    assert (placed / "sub" / "more").read_text() == "more"


@pytest.mark.asyncio
async def test_a_bundle_over_its_cap_at_apparent_size_is_refused_at_both_ends(
    site: Path,
) -> None:
    directory = job_dir(site)
    with (directory / "sparse").open("wb") as file:
        file.truncate(3 << 30)  # 3 GiB, not a byte of it on disk
    os.lchown(directory / "sparse", *ACCOUNT)
    bundle = site / "moving" / "bundle.tar"
    with pytest.raises(bundles.BundleTooLarge, match=r"bundle cap of 1073741824 bytes"):
        await bundles.pack(bundle, site / "moving" / "image", directory, ACCOUNT, 1 << 30)
    assert not bundle.exists()
    _, size = await bundles.pack(bundle, site / "moving" / "image", directory, ACCOUNT, 4 << 30)
    assert size < 1 << 20
    target = site / "target"
    target.mkdir(mode=0o700)
    with pytest.raises(bundles.BundleTooLarge, match="over the bundle cap"):
        bundles.unpack(bundle, target, 1 << 30)
    assert not (target / bundles.JOB).exists()


def crafted(bundle: Path, *members: tuple[tarfile.TarInfo, bytes]) -> None:
    with tarfile.open(bundle, "w") as tar:
        for member, data in members:
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data else None)


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


@pytest.mark.parametrize(
    ("members", "refused"),
    [
        ([member("etc/passwd")], "expected members under image/ and job/"),
        ([member("job", tarfile.DIRTYPE), member("job/x", tarfile.LNKTYPE, "../../secret")], "out"),
        ([member("job", tarfile.DIRTYPE), member("job/x", tarfile.LNKTYPE, "job/no")], "not found"),
        (
            [
                member("job", tarfile.DIRTYPE),
                member("job/up", tarfile.SYMTYPE, "/"),
                member("job/up/etc/owned"),
            ],
            "outside",
        ),
        ([member("job", tarfile.DIRTYPE), member("job/dev", tarfile.CHRTYPE)], "special"),
        ([member("job", tarfile.DIRTYPE), member("image/core-1.img")], "after the job's"),
    ],
    ids=[
        "a-member-elsewhere",
        "a-hard-link-out",
        "a-dangling-hard-link",
        "through-a-link",
        "a-device",
        "an-image-member-among-the-job-s",
    ],
)
def test_a_crafted_bundle_puts_nothing_outside_and_links_nothing_of_the_host(
    site: Path, members: list[tarfile.TarInfo], refused: str
) -> None:
    bundle = site / "crafted.tar"
    crafted(bundle, (member("image", tarfile.DIRTYPE), b""), *((m, b"") for m in members))
    target = site / "target"
    target.mkdir(mode=0o700)
    with pytest.raises((bundles.BundleError, tarfile.TarError), match=refused):
        bundles.unpack(bundle, target, 1 << 30)
    assert (site / "secret").stat().st_nlink == 1
    assert (site / "secret").stat().st_uid == 0


def test_a_link_of_the_job_to_anywhere_is_kept_as_a_link(site: Path) -> None:
    bundle = site / "links.tar"
    crafted(
        bundle,
        (member("image", tarfile.DIRTYPE), b""),
        (member("job", tarfile.DIRTYPE), b""),
        (member("job/l", tarfile.SYMTYPE, "../../.."), b""),
        (member("job/abs", tarfile.SYMTYPE, "/usr/lib"), b""),
    )
    target = site / "target"
    target.mkdir(mode=0o700)
    bundles.unpack(bundle, target, 1 << 30)
    assert os.readlink(target / bundles.JOB / "l") == "../../.."
    assert os.readlink(target / bundles.JOB / "abs") == "/usr/lib"
